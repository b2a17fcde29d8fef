//! lease-service and task-service on fresh databases of their own, task-service pointed at
//! lease-service: what most black-box tests start from. A test file that needs helpers of its
//! own wraps it (a newtype that derefs to it) rather than starting the pair again by hand.

use crate::{Service, fresh_database};

/// The two services and their databases. Dropping it stops both processes.
#[derive(Debug)]
pub struct Stack {
    pub lease_db: String,
    pub task_db: String,
    pub leases: Service,
    pub tasks: Service,
}

impl Stack {
    /// Starts both services, task-service with `task_env` on top of its test defaults, and
    /// waits until both are healthy.
    pub async fn start(task_env: &[(&str, &str)]) -> Stack {
        let lease_db = fresh_database().await;
        let task_db = fresh_database().await;
        let leases = Service::lease_service(&lease_db, &[]).await;
        let tasks = Service::task_service(&task_db, &leases.base_url(), task_env).await;
        Stack {
            lease_db,
            task_db,
            leases,
            tasks,
        }
    }
}
