//! The deploy files checked with real tools, since no Docker engine or cluster runs here:
//! Compose's own parser, Kubernetes' published schemas, the App Platform spec's schema, hadolint;
//! and every command and environment variable they give a Leasehold binary is one it accepts.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
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
    if let Some(sub) = command.get(1) {
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
    assert_eq!(ours, 6, "two migrations and four kinds of process");
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

#[test]
fn the_kubernetes_overlays_render_and_pass_the_published_schemas() {
    let validators = tools::validators();
    let kubectl = kubectl();
    for overlay in ["local", "production"] {
        let dir = workspace().join("deploy/k8s/overlays").join(overlay);
        let rendered = run(Command::new(&kubectl).arg("kustomize").arg(&dir));
        let mut validate = Command::new(validators.join("kubernetes-validate"))
            .args(["--strict", "-k", "1.30.0", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(validate.stdin.as_mut().unwrap(), rendered.as_bytes()).unwrap();
        let output = validate.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "{overlay}: kubernetes-validate failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );

        let documents = yaml_documents(&validators.join("python"), &rendered);
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
                check_container(&format!("{overlay} {kind} {name}"), &args, &env);
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

    let spec = &yaml_documents(
        &validators.join("python"),
        &std::fs::read_to_string(dir.join("app.yaml")).unwrap(),
    )[0];
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
    assert_eq!(spec["databases"].as_array().unwrap().len(), 2);
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
