//! The migrations are embedded at compile time (`embed_migrations!`): rebuild when one is added,
//! which cargo would not notice by itself.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
