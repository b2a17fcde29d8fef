//! Running Leasehold on one machine.
//!
//! * [`postgres`] — a private PostgreSQL server: persistent for the local
//!   stack, ephemeral (and impossible to leak) for test harnesses.
//! * [`stack`] — the `leasehold-local` runner: builds the services, starts
//!   PostgreSQL and every service, and stops them all on Ctrl-C.
//! * [`process`] — spawning children that die with this process.

pub mod postgres;
pub mod process;
pub mod stack;
