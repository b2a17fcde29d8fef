//! lease-service and task-service on fresh databases of their own, task-service pointed at
//! lease-service: what most black-box tests start from, through one builder ([`Stack::with`])
//! for the settings, the tokens and the replicas a test needs. A test file that needs helpers of
//! its own wraps it (a newtype that derefs to it) rather than starting the pair again by hand.

use crate::{Service, fresh_database};

/// The two services and their databases. Dropping it stops every process it started.
#[derive(Debug)]
pub struct Stack {
    pub lease_db: String,
    pub task_db: String,
    pub leases: Service,
    pub tasks: Service,
    /// task-service's other replicas, on the same database ([`StackBuilder::replicas`]).
    pub replicas: Vec<Service>,
}

impl Stack {
    /// Starts both services, task-service with `task_env` on top of its test defaults, and
    /// waits until both are healthy.
    pub async fn start(task_env: &[(&str, &str)]) -> Stack {
        Stack::with().task_env(task_env).start().await
    }

    /// A stack to set up before starting it.
    pub fn with() -> StackBuilder {
        StackBuilder::default()
    }
}

/// What a [`Stack`] starts with: each service's settings (on top of its test defaults), and how
/// many task-service replicas.
#[derive(Debug, Default)]
pub struct StackBuilder {
    lease_env: Vec<(String, String)>,
    task_env: Vec<(String, String)>,
    replicas: usize,
}

fn owned(env: &[(&str, &str)]) -> Vec<(String, String)> {
    env.iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect()
}

fn borrowed(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter()
        .map(|(name, value)| (name.as_str(), value.as_str()))
        .collect()
}

impl StackBuilder {
    /// Settings for both services.
    pub fn env(self, env: &[(&str, &str)]) -> Self {
        self.lease_env(env).task_env(env)
    }

    pub fn lease_env(mut self, env: &[(&str, &str)]) -> Self {
        self.lease_env.extend(owned(env));
        self
    }

    pub fn task_env(mut self, env: &[(&str, &str)]) -> Self {
        self.task_env.extend(owned(env));
        self
    }

    /// Auth on in both services: lease-service knows `lease_tokens`, task-service `task_tokens`
    /// (`AUTH_TOKENS`, `role+role:token,...`), and task-service calls lease-service with
    /// `service_token`, which `lease_tokens` must give the `leaseholder` role.
    pub fn auth(self, lease_tokens: &str, task_tokens: &str, service_token: &str) -> Self {
        self.lease_env(&[("AUTH_TOKENS", lease_tokens)]).task_env(&[
            ("AUTH_TOKENS", task_tokens),
            ("LEASE_SERVICE_TOKEN", service_token),
        ])
    }

    /// Auth on in both services, with `token` holding every role of each, as a client that
    /// may do anything presents it (a fuzzer, a generated client); task-service calls
    /// lease-service with `service_token`.
    pub fn every_role(self, token: &str, service_token: &str) -> Self {
        let lease_tokens = format!("leaseholder+operator:{token},leaseholder:{service_token}");
        let task_tokens = format!("producer+worker+operator:{token}");
        self.auth(&lease_tokens, &task_tokens, service_token)
    }

    /// `count` more task-service replicas, on the same database, with the same settings.
    pub fn replicas(mut self, count: usize) -> Self {
        self.replicas = count;
        self
    }

    /// Starts the services and waits until each is healthy.
    pub async fn start(self) -> Stack {
        let lease_db = fresh_database().await;
        let task_db = fresh_database().await;
        let leases = Service::lease_service(&lease_db, &borrowed(&self.lease_env)).await;
        let task_env = borrowed(&self.task_env);
        let tasks = Service::task_service(&task_db, &leases.base_url(), &task_env).await;
        let mut replicas = Vec::with_capacity(self.replicas);
        for _ in 0..self.replicas {
            replicas.push(Service::task_service(&task_db, &leases.base_url(), &task_env).await);
        }
        Stack {
            lease_db,
            task_db,
            leases,
            tasks,
            replicas,
        }
    }
}

/// A test file's own stack: `struct $name(tests::Stack)`, which derefs to the [`Stack`], for
/// the file to add its helpers to.
#[macro_export]
macro_rules! stack_with_helpers {
    ($name:ident) => {
        struct $name($crate::Stack);

        impl std::ops::Deref for $name {
            type Target = $crate::Stack;
            fn deref(&self) -> &$crate::Stack {
                &self.0
            }
        }

        impl std::ops::DerefMut for $name {
            fn deref_mut(&mut self) -> &mut $crate::Stack {
                &mut self.0
            }
        }
    };
}
