//! The deploy files checked with real tools, since no Docker engine or cluster runs here:
//! Compose's own parser, Kubernetes' published schemas, the App Platform spec's schema, hadolint;
//! and every command and environment variable they give a Leasehold binary is one it accepts.
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;
use tests::{binary, tools};

const BINARIES: [&str; 5] = [
    "lease-service",
    "task-service",
    "worker",
    "task-generator",
    "leasehold",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn run(command: &mut Command) -> String {
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{command:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// YAML (one or several documents) as JSON values, parsed by PyYAML.
fn yaml_documents(python: &Path, yaml: &str) -> Vec<Value> {
    let mut child = Command::new(python)
        .args([
            "-c",
            "import sys, yaml, json; json.dump([d for d in yaml.safe_load_all(sys.stdin) if d], sys.stdout)",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), yaml.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    serde_json::from_slice::<Vec<Value>>(&output.stdout).unwrap()
}

/// The environment variables `binary` documents in its `--help` (and its subcommands').
fn accepted_env(binary_name: &str) -> HashSet<String> {
    let mut names = HashSet::new();
    let mut helps = vec![run(Command::new(binary(binary_name)).arg("--help"))];
    if matches!(binary_name, "lease-service" | "task-service") {
        helps.push(run(
            Command::new(binary(binary_name)).args(["migrate", "--help"])
        ));
    }
    for help in helps {
        for part in help.split("[env: ").skip(1) {
            let name: String = part
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || *c == '_' || c.is_ascii_digit())
                .collect();
            names.insert(name);
        }
    }
    names
}

/// Checks one container: a known binary with a known subcommand, and only variables it reads.
fn check_container(context: &str, command: &[String], env: &[String]) {
    let binary_name = command
        .first()
        .unwrap_or_else(|| panic!("{context}: no command"));
    assert!(
        BINARIES.contains(&binary_name.as_str()),
        "{context}: unknown binary {binary_name}"
    );
    if command.get(1).is_some_and(|arg| arg.starts_with('-')) {
        check_flags(context, binary_name, &command[1..]);
    } else if let Some(sub) = command.get(1) {
        assert!(
            matches!(
                (binary_name.as_str(), sub.as_str()),
                ("lease-service" | "task-service", "serve" | "migrate")
            ),
            "{context}: {binary_name} has no subcommand {sub}"
        );
    }
    let accepted = accepted_env(binary_name);
    for name in env {
        let standard = name == "RUST_LOG" || name == "LOG_FORMAT" || name.starts_with("OTEL_");
        assert!(
            standard || accepted.contains(name),
            "{context}: {binary_name} does not read {name}"
        );
    }
}

/// A command given as flags (`worker --exec -- sh /usr/local/share/...`): each flag before `--`
/// is one `--help` names, and a file of the image after it is one the Dockerfile puts there.
fn check_flags(context: &str, binary_name: &str, args: &[String]) {
    let help = run(Command::new(binary(binary_name)).arg("--help"));
    let (flags, rest) = match args.iter().position(|arg| arg == "--") {
        Some(end) => (&args[..end], &args[end + 1..]),
        None => (args, &[][..]),
    };
    for flag in flags {
        let name = flag.split('=').next().unwrap();
        assert!(
            help.contains(&format!("{name} ")) || help.contains(&format!("{name}\n")),
            "{context}: {binary_name} has no flag {name}"
        );
    }
    let dockerfile = std::fs::read_to_string(workspace().join("deploy/Dockerfile")).unwrap();
    for file in rest
        .iter()
        .filter(|arg| arg.starts_with("/usr/local/share/"))
    {
        assert!(
            dockerfile.contains(file.as_str()),
            "{context}: {file} is not put in the image by deploy/Dockerfile"
        );
    }
}

fn strings(value: &Value) -> Vec<String> {
    match value {
        Value::Array(items) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        Value::String(s) => s.split_whitespace().map(str::to_owned).collect(),
        _ => Vec::new(),
    }
}

#[test]
fn the_compose_file_parses_and_gives_each_binary_only_what_it_accepts() {
    let compose = tools::docker_compose();
    let file = workspace().join("deploy/docker-compose.yml");
    let rendered = run(Command::new(&compose).arg("-f").arg(&file).arg("config"));
    let config = &yaml_documents(&compose.with_file_name("python"), &rendered)[0];
    let services = config["services"].as_object().unwrap();

    let replicas = |name: &str| services[name]["deploy"]["replicas"].as_i64().unwrap_or(1);
    assert_eq!(
        (
            replicas("lease-service"),
            replicas("task-service"),
            replicas("task-generator"),
            replicas("worker")
        ),
        (2, 2, 2, 3)
    );
    assert!(
        services["load-balancer"]["image"]
            .as_str()
            .unwrap()
            .starts_with("nginx:")
    );
    assert!(
        services["jaeger"]["image"]
            .as_str()
            .unwrap()
            .starts_with("jaegertracing/all-in-one:")
    );
    for migration in ["migrate-leases", "migrate-tasks"] {
        assert_eq!(strings(&services[migration]["command"])[1], "migrate");
    }
    let mut ours = 0;
    for (name, service) in services {
        if service["image"] != "leasehold:latest" {
            continue;
        }
        ours += 1;
        let command = strings(&service["command"]);
        let env = service["environment"].as_object().unwrap();
        let names: Vec<String> = env.keys().cloned().collect();
        check_container(&format!("compose service {name}"), &command, &names);
        // Health checks ask the port the binary listens on.
        if let Some(test) = service["healthcheck"]["test"].as_array() {
            let url = test.last().unwrap().as_str().unwrap();
            let listen = env
                .get("LISTEN_ADDR")
                .or_else(|| env.get("METRICS_ADDR"))
                .unwrap()
                .as_str()
                .unwrap();
            let port = listen.rsplit(':').next().unwrap();
            assert!(
                url.contains(&format!(":{port}/")),
                "{name}: health check {url} misses port {port}"
            );
        }
        // Services start only after their migrations and dependencies are healthy or done.
        if command.get(1).map(String::as_str) == Some("serve") {
            assert!(
                service["depends_on"].is_object(),
                "{name} has no depends_on"
            );
        }
    }
    assert_eq!(
        ours, 7,
        "two migrations and four kinds of process, the worker twice (its own work and exec)"
    );
}

fn kubectl() -> PathBuf {
    for candidate in ["/usr/bin/kubectl", "/usr/local/bin/kubectl"] {
        if Path::new(candidate).exists() {
            return PathBuf::from(candidate);
        }
    }
    let root = nix::unistd::Uid::effective().is_root();
    assert!(
        root,
        "kubectl is missing: run `sudo apt-get install -y kubernetes-client`"
    );
    run(Command::new("apt-get").arg("update"));
    run(Command::new("apt-get").args(["install", "-y", "kubernetes-client"]));
    PathBuf::from("/usr/bin/kubectl")
}

/// A CloudNativePG `Cluster`: a custom resource, which Kubernetes' published schemas do not
/// cover, so `check_postgres_clusters` checks it instead of kubernetes-validate.
fn is_cnpg_cluster(document: &Value) -> bool {
    document["apiVersion"] == "postgresql.cnpg.io/v1" && document["kind"] == "Cluster"
}

/// The keys of the Secret "<cluster>-app" that CloudNativePG writes for the owner of the
/// cluster's bootstrap database (`uri`'s host is the cluster's "-rw" Service).
const CNPG_APP_SECRET_KEYS: [&str; 11] = [
    "username",
    "user",
    "password",
    "dbname",
    "host",
    "port",
    "pgpass",
    "uri",
    "jdbc-uri",
    "fqdn-uri",
    "fqdn-jdbc-uri",
];

/// The database a binary's DATABASE_URL names (one database per service, as in compose).
fn database_of(binary_name: &str) -> Option<&'static str> {
    match binary_name {
        "lease-service" => Some("leasehold_leases"),
        "task-service" => Some("leasehold_tasks"),
        _ => None,
    }
}

/// Runs kubernetes-validate --strict on `documents` and requires each of them to have passed:
/// on a kind it has no schema for, kubernetes-validate only warns and still exits 0.
fn validate_against_published_schemas(validators: &Path, overlay: &str, documents: &[&Value]) {
    let stream: String = documents.iter().map(|d| format!("---\n{d}\n")).collect();
    let mut validate = Command::new(validators.join("kubernetes-validate"))
        .args(["--strict", "-k", "1.30.0", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(validate.stdin.as_mut().unwrap(), stream.as_bytes()).unwrap();
    let output = validate.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "{overlay}: kubernetes-validate failed:\n{report}"
    );
    let passed = report
        .lines()
        .filter(|l| l.contains("passed for resource"))
        .count();
    assert_eq!(
        passed,
        documents.len(),
        "{overlay}: kubernetes-validate did not validate every object (no schema?):\n{report}"
    );
}

/// Checks the overlay's CloudNativePG clusters: a standby to fail over to, synchronous
/// replication that every commit waits for, a bootstrap database with its owner, storage.
/// Returns each cluster's name with the database its bootstrap creates.
fn check_postgres_clusters(overlay: &str, documents: &[Value]) -> HashMap<String, String> {
    let mut clusters = HashMap::new();
    for cluster in documents.iter().filter(|d| is_cnpg_cluster(d)) {
        let name = cluster["metadata"]["name"].as_str().unwrap();
        let context = format!("{overlay} Cluster {name}");
        let spec = &cluster["spec"];
        // The operator's default is one instance.
        let instances = spec["instances"].as_i64().unwrap_or(1);
        assert!(
            instances >= 2,
            "{context}: {instances} instance(s): no standby to fail over to"
        );
        let synchronous = &spec["postgresql"]["synchronous"];
        assert!(
            matches!(synchronous["method"].as_str(), Some("any" | "first")),
            "{context}: no synchronous replication (spec.postgresql.synchronous.method)"
        );
        let number = synchronous["number"].as_i64().unwrap_or(0);
        assert!(
            (1..instances).contains(&number),
            "{context}: synchronous.number {number} must be 1 to {} (instances - 1)",
            instances - 1
        );
        assert_eq!(
            synchronous["dataDurability"], "required",
            "{context}: a commit must wait for a standby (synchronous.dataDurability: required)"
        );
        let initdb = &spec["bootstrap"]["initdb"];
        let database = initdb["database"]
            .as_str()
            .unwrap_or_else(|| panic!("{context}: no spec.bootstrap.initdb.database"));
        assert!(
            initdb["owner"].is_string(),
            "{context}: no spec.bootstrap.initdb.owner"
        );
        assert!(
            spec["storage"]["size"].is_string(),
            "{context}: no spec.storage.size"
        );
        clusters.insert(name.to_owned(), database.to_owned());
    }
    clusters
}

/// Where a container's DATABASE_URL comes from, checked against the overlay's clusters: the
/// `uri` of a cluster's "-app" Secret, or a URL naming its "-rw" Service; and the cluster's
/// bootstrap database must be the one `binary_name` uses. Returns whether it is a cluster's.
fn database_url_from_cluster(
    context: &str,
    binary_name: &str,
    container: &Value,
    clusters: &HashMap<String, String>,
) -> bool {
    let expected = database_of(binary_name).unwrap();
    let env = container["env"].as_array().unwrap();
    let url = env
        .iter()
        .find(|e| e["name"] == "DATABASE_URL")
        .unwrap_or_else(|| panic!("{context}: no DATABASE_URL"));
    let cluster = if let Some(reference) = url["valueFrom"]["secretKeyRef"].as_object() {
        let secret = reference["name"].as_str().unwrap();
        let Some(cluster) = secret
            .strip_suffix("-app")
            .filter(|c| clusters.contains_key(*c))
        else {
            return false;
        };
        assert!(
            matches!(reference["key"].as_str(), Some("uri" | "fqdn-uri")),
            "{context}: DATABASE_URL from {secret} must be its key uri"
        );
        cluster
    } else if let Some(value) = url["value"].as_str() {
        let Some(cluster) = clusters
            .keys()
            .find(|c| value.contains(&format!("@{c}-rw")))
        else {
            return false;
        };
        assert!(
            value.contains(&format!("/{expected}")),
            "{context}: DATABASE_URL {value} does not name the database {expected}"
        );
        cluster.as_str()
    } else {
        return false;
    };
    assert_eq!(
        clusters[cluster], expected,
        "{context}: DATABASE_URL names cluster {cluster}, whose database is not {expected}"
    );
    true
}

#[test]
fn the_kubernetes_overlays_render_and_pass_the_published_schemas() {
    let validators = tools::validators();
    let kubectl = kubectl();
    for overlay in ["local", "production"] {
        let dir = workspace().join("deploy/k8s/overlays").join(overlay);
        let rendered = run(Command::new(&kubectl).arg("kustomize").arg(&dir));
        let documents = yaml_documents(&validators.join("python"), &rendered);
        // Every standard object against Kubernetes' schemas; the clusters are checked below.
        let standard: Vec<&Value> = documents.iter().filter(|d| !is_cnpg_cluster(d)).collect();
        validate_against_published_schemas(&validators, overlay, &standard);
        let clusters = check_postgres_clusters(overlay, &documents);
        if overlay == "production" {
            assert!(
                !clusters.is_empty(),
                "production: no CloudNativePG Cluster (deploy/k8s/overlays/production/database.yaml)"
            );
        }

        let kinds: HashSet<&str> = documents
            .iter()
            .filter_map(|d| d["kind"].as_str())
            .collect();
        for kind in [
            "Deployment",
            "Service",
            "Job",
            "ConfigMap",
            "Secret",
            "PodDisruptionBudget",
            "HorizontalPodAutoscaler",
        ] {
            assert!(kinds.contains(kind), "{overlay}: no {kind}");
        }
        // Secret name -> its keys, for the containers' secretKeyRefs.
        let secrets: HashMap<&str, HashSet<&str>> = documents
            .iter()
            .filter(|d| d["kind"] == "Secret")
            .map(|d| {
                let keys = ["data", "stringData"]
                    .iter()
                    .filter_map(|field| d[field].as_object())
                    .flat_map(|o| o.keys().map(String::as_str))
                    .collect();
                (d["metadata"]["name"].as_str().unwrap(), keys)
            })
            .collect();
        let mut database_users = 0;
        for document in &documents {
            let kind = document["kind"].as_str().unwrap_or("");
            if kind != "Deployment" && kind != "Job" {
                continue;
            }
            let name = document["metadata"]["name"].as_str().unwrap_or("?");
            let pod = &document["spec"]["template"]["spec"];
            for container in pod["containers"].as_array().unwrap() {
                let command = strings(&container["command"]);
                let mut args = command.clone();
                args.extend(strings(&container["args"]));
                let env: Vec<String> = container["env"]
                    .as_array()
                    .map(|e| {
                        e.iter()
                            .filter_map(|v| v["name"].as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                let context = format!("{overlay} {kind} {name}");
                check_container(&context, &args, &env);
                // Every Secret a variable comes from is rendered, or is a cluster's "-app".
                for variable in container["env"].as_array().into_iter().flatten() {
                    let Some(reference) = variable["valueFrom"]["secretKeyRef"].as_object() else {
                        continue;
                    };
                    let secret = reference["name"].as_str().unwrap();
                    let key = reference["key"].as_str().unwrap();
                    let known = match secrets.get(secret) {
                        Some(keys) => keys.contains(key),
                        None => {
                            secret
                                .strip_suffix("-app")
                                .is_some_and(|c| clusters.contains_key(c))
                                && CNPG_APP_SECRET_KEYS.contains(&key)
                        }
                    };
                    assert!(
                        known,
                        "{context}: {} comes from {secret}/{key}, which nothing provides",
                        variable["name"]
                    );
                }
                if database_of(&args[0]).is_some() {
                    database_users += 1;
                    let from_cluster =
                        database_url_from_cluster(&context, &args[0], container, &clusters);
                    assert!(
                        from_cluster || overlay != "production",
                        "{context}: DATABASE_URL must come from a CloudNativePG cluster's \
                         \"<cluster>-app\" Secret (key uri) or name its \"<cluster>-rw\" Service"
                    );
                }
                if kind == "Deployment" {
                    assert!(
                        container["readinessProbe"].is_object(),
                        "{overlay} {name}: no readiness probe"
                    );
                    assert!(
                        container["livenessProbe"].is_object(),
                        "{overlay} {name}: no liveness probe"
                    );
                    assert!(
                        container["resources"]["limits"].is_object(),
                        "{overlay} {name}: no limits"
                    );
                }
            }
            if name.contains("worker") && kind == "Deployment" {
                let grace = pod["terminationGracePeriodSeconds"].as_i64().unwrap_or(30);
                assert!(
                    grace > 30,
                    "{overlay}: worker grace {grace} s is not longer than its own 30 s"
                );
            }
        }
        assert_eq!(
            database_users, 4,
            "{overlay}: two services and their two migration Jobs use a database"
        );
    }
}

#[test]
fn the_app_platform_spec_matches_the_documented_schema_like_the_sample() {
    let validators = tools::validators();
    let dir = workspace().join("deploy/app-platform");
    let sample = workspace()
        .parent()
        .unwrap()
        .join("shared/reference/sample-app-platform-spec.yaml");
    let script = "import sys, json, yaml, jsonschema\n\
                  schema = json.load(open(sys.argv[1]))\n\
                  for path in sys.argv[2:]:\n    jsonschema.validate(yaml.safe_load(open(path)), schema)\n";
    let mut command = Command::new(validators.join("python"));
    command
        .args(["-c", script])
        .arg(dir.join("app-spec.schema.json"))
        .arg(dir.join("app.yaml"));
    if sample.exists() {
        command.arg(&sample);
    }
    run(&mut command);

    let text = std::fs::read_to_string(dir.join("app.yaml")).unwrap();
    let spec = &yaml_documents(&validators.join("python"), &text)[0];

    // The databases: production databases in a managed cluster with a standby node. The app
    // spec has no field for nodes (the schema above rejects unknown fields), so the standby is
    // the cluster's own, which app.yaml documents creating with doctl.
    let mut databases = HashMap::new();
    for database in spec["databases"].as_array().unwrap() {
        let name = database["name"].as_str().unwrap();
        assert_eq!(database["engine"], "PG", "database {name}: PostgreSQL");
        assert_eq!(
            database["production"], true,
            "database {name}: a dev database has no standby; use a production managed cluster"
        );
        let cluster = database["cluster_name"]
            .as_str()
            .unwrap_or_else(|| panic!("database {name}: a production database needs cluster_name"));
        assert!(
            database["db_user"].is_string(),
            "database {name}: no db_user"
        );
        let create = format!("doctl databases create {cluster} ");
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with('#') && l.contains(&create))
            .unwrap_or_else(|| panic!("app.yaml: no comment `{create}--engine pg --num-nodes 2`"));
        let words: Vec<&str> = line.split_whitespace().collect();
        let flag = |name: &str| {
            words
                .iter()
                .position(|w| *w == name)
                .and_then(|i| words.get(i + 1).copied())
        };
        assert_eq!(flag("--engine"), Some("pg"), "{line}");
        let nodes: i64 = flag("--num-nodes")
            .and_then(|n| n.parse().ok())
            .unwrap_or(1);
        assert!(
            nodes >= 2,
            "{cluster}: --num-nodes {nodes}: a primary and at least one standby"
        );
        let db_name = database["db_name"]
            .as_str()
            .unwrap_or_else(|| panic!("database {name}: no db_name"));
        databases.insert(format!("${{{name}.DATABASE_URL}}"), db_name);
    }
    assert_eq!(databases.len(), 2);

    let mut components = 0;
    for group in ["services", "workers", "jobs"] {
        for component in spec[group].as_array().unwrap() {
            components += 1;
            let name = component["name"].as_str().unwrap();
            assert_eq!(
                component["dockerfile_path"], "deploy/Dockerfile",
                "{name} builds from the Dockerfile"
            );
            let command = strings(&component["run_command"]);
            let env: Vec<String> = component["envs"]
                .as_array()
                .map(|e| {
                    e.iter()
                        .filter_map(|v| v["key"].as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            check_container(&format!("app.yaml {name}"), &command, &env);
            // Each service and its migration use its own database, bound from the spec's.
            if let Some(expected) = database_of(&command[0]) {
                let url = component["envs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|e| e["key"] == "DATABASE_URL")
                    .and_then(|e| e["value"].as_str())
                    .unwrap_or_else(|| panic!("app.yaml {name}: no DATABASE_URL"));
                assert_eq!(
                    databases.get(url).copied(),
                    Some(expected),
                    "app.yaml {name}: DATABASE_URL {url} is not the database {expected}"
                );
            }
        }
    }
    assert!(components >= 6);
    let jobs: Vec<&str> = spec["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|j| j["kind"].as_str())
        .collect();
    assert_eq!(jobs, ["PRE_DEPLOY", "PRE_DEPLOY"]);
}

#[test]
fn the_dockerfile_lints_clean_and_builds_with_the_command_ci_runs() {
    let validators = tools::validators();
    let dockerfile = workspace().join("deploy/Dockerfile");
    run(Command::new(validators.join("hadolint")).arg(&dockerfile));
    // The smoke test's stand-ins for the base images are held to the same rules.
    let standins = workspace().join("deploy/smoke/standins");
    let mut linted = 0;
    for entry in std::fs::read_dir(&standins).unwrap() {
        let file = entry.unwrap().path().join("Dockerfile");
        if file.exists() {
            run(Command::new(validators.join("hadolint")).arg(&file));
            linted += 1;
        }
    }
    assert_eq!(linted, 4, "rust, postgres, nginx and jaeger stand-ins");
    let text = std::fs::read_to_string(&dockerfile).unwrap();
    assert!(
        text.contains("RUN deploy/build.sh --release"),
        "the image builds with deploy/build.sh"
    );
    let ci = std::fs::read_to_string(workspace().join(".ci/run")).unwrap();
    assert!(
        ci.lines()
            .any(|l| l.trim_start().starts_with("deploy/build.sh")),
        "CI builds with deploy/build.sh"
    );
    // The image ships exactly the binaries the build makes.
    for name in BINARIES {
        assert!(
            text.contains(&format!("/src/target/release/{name}")),
            "the image lacks {name}"
        );
        assert!(binary(name).exists());
    }
    assert!(text.contains("USER 10001"), "runs as a non-root user");
    let ignore = std::fs::read_to_string(workspace().join(".dockerignore")).unwrap();
    assert!(ignore.lines().any(|l| l.trim() == "target/"));
}

/// The package selection of deploy/build.sh, which the image and CI build with.
const SHIPPED_SELECTION: [&str; 3] = ["--workspace", "--exclude", "tests"];

/// What `cargo tree` says turns lease-service's features on, for `selection` of the workspace
/// (dev-dependencies left out, as `cargo build` leaves them).
fn lease_service_features(selection: &[&str]) -> String {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run(Command::new(cargo)
        .current_dir(workspace())
        .args([
            "tree",
            "--locked",
            "--offline",
            "--edges",
            "normal,build,features",
        ])
        .args(["--invert", "lease-service"])
        .args(selection))
}

#[test]
fn the_shipped_build_has_no_test_hooks() {
    let script = std::fs::read_to_string(workspace().join("deploy/build.sh")).unwrap();
    let build = script
        .lines()
        .find(|l| l.contains("cargo build"))
        .expect("deploy/build.sh runs cargo build");
    assert!(
        build.contains(&SHIPPED_SELECTION.join(" ")),
        "deploy/build.sh must build {SHIPPED_SELECTION:?}: {build}"
    );
    let shipped = lease_service_features(&SHIPPED_SELECTION);
    assert!(shipped.contains("lease-service v"), "{shipped}");
    assert!(
        !shipped.contains("test-hooks"),
        "the shipped lease-service would carry LEASEHOLD_TEST_BREAK_ACQUIRE:\n{shipped}"
    );
    // The whole workspace does turn the hooks on (the tests need them), so the check above
    // would see them if the tests crate crept back into the shipped build.
    assert!(lease_service_features(&["--workspace"]).contains("test-hooks"));
    // Every shipped binary still comes out of that build.
    let metadata: Value = serde_json::from_str(&run(Command::new(
        std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()),
    )
    .current_dir(workspace())
    .args([
        "metadata",
        "--locked",
        "--offline",
        "--no-deps",
        "--format-version",
        "1",
    ])))
    .unwrap();
    let built: HashSet<&str> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["name"] != "tests")
        .flat_map(|p| p["targets"].as_array().unwrap())
        .filter(|t| t["kind"].as_array().unwrap().iter().any(|k| k == "bin"))
        .filter_map(|t| t["name"].as_str())
        .collect();
    for name in BINARIES.iter().chain(&["leasehold-local"]) {
        assert!(
            built.contains(name),
            "deploy/build.sh no longer builds {name}"
        );
    }
}
