//! Scale-out (docs/deploy.md): the Kubernetes manifests in deploy/kubernetes/
//! against the Kubernetes API schemas (PyPI `kubernetes-validate`, offline)
//! and against `tts serve` itself (their arguments, profile and autoscaling
//! metric); and three replicas behind HAProxy with deploy/haproxy/haproxy.cfg
//! answering a load run, every request, while one replica is stopped and
//! restarted.

mod common;

use common::{plugins_with, repo, start_serve, start_serve_on, supertonic_fixture, Serving};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A profile for the tiny Supertonic fixture, served as model `supertonic`.
fn supertonic_profile(dir: &Path) -> PathBuf {
    let path = dir.join("supertonic.toml");
    let body =
        format!("[backend]\nprefer = [\"cpu\"]\nfallback = false\n[backends.cpu]\nthreads = 1\n[model]\nfiles = [\"{}\"]\n", supertonic_fixture().display());
    std::fs::write(&path, body).unwrap();
    path
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(120))).build().into()
}

fn get(url: &str) -> (u16, String) {
    let mut r = agent().get(url).call().unwrap_or_else(|e| panic!("GET {url}: {e}"));
    (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
}

/// The value of the sample `name{labels}` in Prometheus text.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
}

/// The autoscaler's custom metric must exist on a replica that has not
/// served a request yet: a gauge created on the first request left an idle
/// replica without the series, which the HPA takes as missing data (and
/// then never scales down).
#[test]
fn queue_depth_and_busy_workers_are_exported_at_zero_from_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let profile = supertonic_profile(dir.path());
    let server = start_serve(&["--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap()]);
    let (status, metrics) = get(&format!("{}/metrics", server.base));
    assert_eq!(status, 200);
    assert_eq!(sample(&metrics, "tts_queue_depth{model=\"supertonic\"}"), Some(0.0), "{metrics}");
    assert_eq!(sample(&metrics, "tts_busy_workers{model=\"supertonic\"}"), Some(0.0), "{metrics}");
    // The HPA scales on this very series.
    let hpa = std::fs::read_to_string(repo().join("deploy/kubernetes/hpa.yaml")).unwrap();
    assert!(hpa.contains("name: tts_queue_depth"), "hpa.yaml names another metric");
}

/// The virtualenv holding `kubernetes-validate` (xtask puts it in
/// target/k8s-venv and names it in TTS_KUBERNETES_VALIDATE_VENV); None, with
/// a message, where it is absent and CI does not require it.
fn kubernetes_validate_venv() -> Option<PathBuf> {
    let venv = std::env::var_os("TTS_KUBERNETES_VALIDATE_VENV").map(PathBuf::from).unwrap_or_else(|| repo().join("target/k8s-venv"));
    if venv.join("bin/kubernetes-validate").is_file() {
        return Some(venv);
    }
    assert!(
        std::env::var_os("TTS_REQUIRE_KUBERNETES_VALIDATE").is_none(),
        "TTS_REQUIRE_KUBERNETES_VALIDATE is set but {} has no kubernetes-validate (cargo xtask test installs it)",
        venv.display()
    );
    eprintln!("skipped: no kubernetes-validate in {} (cargo xtask test installs it)", venv.display());
    None
}

fn manifests() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("deploy/kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "deploy/kubernetes/ holds {files:?}");
    files
}

/// `kubernetes-validate --strict` (unknown fields are errors) against the
/// schemas of the Kubernetes version the package is pinned to.
fn validate(venv: &Path, files: &[PathBuf]) -> std::process::Output {
    let child = Command::new(venv.join("bin/kubernetes-validate"))
        .args(["--strict", "--quiet"])
        .args(files)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_or_kill(child, Duration::from_secs(120), "kubernetes-validate")
}

#[test]
fn kubernetes_manifests_validate_against_the_schemas() {
    let Some(venv) = kubernetes_validate_venv() else { return };
    let files = manifests();
    let out = validate(&venv, &files);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("ERROR"), "{text}");

    // The validator does check: a misspelled field and a wrongly typed value
    // in copies of the same files are refused, each named.
    let dir = tempfile::tempdir().unwrap();
    let deployment = std::fs::read_to_string(repo().join("deploy/kubernetes/deployment.yaml")).unwrap();
    let hpa = std::fs::read_to_string(repo().join("deploy/kubernetes/hpa.yaml")).unwrap();
    assert!(deployment.contains("readinessProbe:") && hpa.contains("averageUtilization: 70"));
    let bad_deployment = dir.path().join("deployment.yaml");
    let bad_hpa = dir.path().join("hpa.yaml");
    std::fs::write(&bad_deployment, deployment.replace("readinessProbe:", "readinessProbes:")).unwrap();
    std::fs::write(&bad_hpa, hpa.replace("averageUtilization: 70", "averageUtilization: \"70%\"")).unwrap();
    let out = validate(&venv, &[bad_deployment, bad_hpa]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("'readinessProbes' was unexpected"), "{text}");
    assert!(text.contains("averageUtilization: '70%' is not of type 'integer'"), "{text}");
}

/// Every document of the manifests, as JSON (PyYAML, which
/// kubernetes-validate brings, reads the YAML).
fn manifest_documents(venv: &Path) -> Vec<Value> {
    let script = "import json, sys, yaml\nprint(json.dumps([d for f in sys.argv[1:] for d in yaml.safe_load_all(open(f)) if d]))";
    let child = Command::new(venv.join("bin/python")).arg("-c").arg(script).args(manifests()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let out = common::wait_or_kill(child, Duration::from_secs(60), "reading the manifests");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind} in deploy/kubernetes/");
    found[0]
}

/// `--NAME=VALUE` among the container's arguments.
fn flag<'a>(args: &'a [String], name: &str) -> &'a str {
    args.iter().find_map(|a| a.strip_prefix(&format!("--{name}="))).unwrap_or_else(|| panic!("no --{name}= in {args:?}"))
}

/// The manifests fit together and fit `tts serve`: the Service and the
/// probes reach the port the server listens on, the probes ask /health, the
/// drain fits in the grace period, the profile of the ConfigMap is a valid
/// profile that serves (with the tiny fixture in place of the real model),
/// and the HPA's custom metric is a series that server exports.
#[test]
fn kubernetes_manifests_fit_tts_serve() {
    let Some(venv) = kubernetes_validate_venv() else { return };
    let docs = manifest_documents(&venv);
    let deployment = of_kind(&docs, "Deployment");
    let pod = &deployment["spec"]["template"];
    let labels = pod["metadata"]["labels"].as_object().unwrap();
    for (k, v) in deployment["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(labels.get(k), Some(v), "the Deployment's selector {k}");
    }
    let containers = pod["spec"]["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    assert_eq!(c["command"], serde_json::json!(["tts", "serve"]));
    let args: Vec<String> = serde_json::from_value(c["args"].clone()).unwrap();
    let port: u64 = flag(&args, "port").parse().unwrap();
    let port_name = c["ports"][0]["name"].as_str().unwrap();
    assert_eq!(c["ports"][0]["containerPort"], port);
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        assert_eq!(c[probe]["httpGet"]["path"], "/health", "{probe}");
        assert_eq!(c[probe]["httpGet"]["port"], port_name, "{probe}");
    }
    // Kubernetes kills the container at the end of the grace period: the
    // preStop wait and the server's drain must end before it, and the
    // liveness probe (which sees /health's 503 while draining) must not
    // restart the container first.
    let grace = pod["spec"]["terminationGracePeriodSeconds"].as_u64().unwrap();
    let drain: u64 = flag(&args, "shutdown-grace").parse().unwrap();
    let pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"].as_u64().unwrap();
    assert!(pre_stop + drain < grace, "preStop {pre_stop} s + drain {drain} s within the grace period {grace} s");
    let liveness = &c["livenessProbe"];
    assert!(liveness["periodSeconds"].as_u64().unwrap() * liveness["failureThreshold"].as_u64().unwrap() > grace);
    for (what, value) in [("requests", "cpu"), ("requests", "memory"), ("limits", "memory")] {
        assert!(c["resources"][what][value].is_string(), "resources.{what}.{value}");
    }
    let key = c["env"].as_array().unwrap().iter().find(|e| e["name"] == "TTS_API_KEY").expect("TTS_API_KEY in the environment");
    assert!(key["valueFrom"]["secretKeyRef"]["name"].is_string(), "the API key comes from a Secret");

    let service = of_kind(&docs, "Service");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], port_name);
    for (k, v) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(labels.get(k), Some(v), "the Service's selector {k}");
    }
    let hpa = of_kind(&docs, "HorizontalPodAutoscaler");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["kind"], "Deployment");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["name"], deployment["metadata"]["name"]);
    let metrics = hpa["spec"]["metrics"].as_array().unwrap();
    assert!(metrics.iter().any(|m| m["type"] == "Resource" && m["resource"]["name"] == "cpu"), "the HPA scales on CPU");
    let custom = metrics.iter().find(|m| m["type"] == "Pods").expect("the HPA scales on a metric of the pods");
    let custom = custom["pods"]["metric"]["name"].as_str().unwrap();
    for d in docs.iter().filter(|d| d["kind"] == "PodDisruptionBudget") {
        for (k, v) in d["spec"]["selector"]["matchLabels"].as_object().unwrap() {
            assert_eq!(labels.get(k), Some(v), "the disruption budget's selector {k}");
        }
    }

    // The profile: the volume mounted where --profile points holds it.
    let profile_path = Path::new(flag(&args, "profile"));
    let mount = c["volumeMounts"].as_array().unwrap().iter().find(|m| profile_path.starts_with(m["mountPath"].as_str().unwrap())).expect("--profile's volume");
    let volume = pod["spec"]["volumes"].as_array().unwrap().iter().find(|v| v["name"] == mount["name"]).unwrap();
    let config_map = docs.iter().find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == volume["configMap"]["name"]).expect("the profile's ConfigMap");
    let file_name = profile_path.file_name().unwrap().to_str().unwrap();
    let profile_text = config_map["data"][file_name].as_str().unwrap_or_else(|| panic!("no {file_name} in the ConfigMap"));
    // Served as the Deployment runs it, on loopback, with the tiny fixture
    // where the volume would hold the real model.
    let models_mount = c["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "models").expect("the models volume");
    assert!(profile_text.contains(models_mount["mountPath"].as_str().unwrap()), "the profile reads its model from the models volume");
    let claim = pod["spec"]["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "models").unwrap()["persistentVolumeClaim"]["claimName"].clone();
    assert!(docs.iter().any(|d| d["kind"] == "PersistentVolumeClaim" && d["metadata"]["name"] == claim), "the models' claim {claim}");
    let job = of_kind(&docs, "Job");
    let job_pod = &job["spec"]["template"]["spec"];
    assert!(job_pod["volumes"].as_array().unwrap().iter().any(|v| v["persistentVolumeClaim"]["claimName"] == claim), "the pull job fills {claim}");
    let dir = tempfile::tempdir().unwrap();
    let local_profile = dir.path().join(file_name);
    let model_line = profile_text.lines().find(|l| l.trim_start().starts_with("files")).unwrap();
    std::fs::write(&local_profile, profile_text.replace(model_line, &format!("files = [\"{}\"]", supertonic_fixture().display()))).unwrap();
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let mut served: Vec<String> =
        args.iter().filter(|a| !a.starts_with("--host=") && !a.starts_with("--port=") && !a.starts_with("--profile=")).cloned().collect();
    served.extend(["--profile".into(), local_profile.display().to_string(), "--plugin-dir".into(), plugins.path().display().to_string()]);
    // What the Secret gives the pod (the arguments may require a key).
    served.extend(["--api-key".into(), "from-the-secret".into()]);
    let served: Vec<&str> = served.iter().map(String::as_str).collect();
    let server = start_serve(&served);
    let (status, text) = get(&format!("{}/metrics", server.base));
    assert_eq!(status, 200);
    let model = file_name.strip_suffix(".toml").unwrap();
    assert_eq!(sample(&text, &format!("{custom}{{model=\"{model}\"}}")), Some(0.0), "the HPA's metric {custom} on /metrics:\n{text}");
}

/// HAProxy where CI has it; None, with a message, elsewhere.
fn haproxy() -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).chain([PathBuf::from("/usr/sbin")]).map(|d| d.join("haproxy")).find(|p| p.is_file()));
    if found.is_none() {
        assert!(std::env::var_os("TTS_REQUIRE_HAPROXY").is_none(), "TTS_REQUIRE_HAPROXY is set but haproxy is not installed (cargo xtask deps installs it)");
        eprintln!("skipped: haproxy is not installed (cargo xtask deps installs it)");
    }
    found
}

/// HAProxy running deploy/haproxy/haproxy.cfg, with an admin socket added in
/// a second file; killed when dropped.
struct Balancer {
    child: std::process::Child,
    base: String,
    admin: PathBuf,
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Balancer {
    /// Listens on a free loopback port (looked up, then bound by HAProxy:
    /// another process may take it between, so a failed start is tried
    /// again on another port, up to three times).
    fn start(haproxy: &Path, dir: &Path, replicas: &[String]) -> Balancer {
        let admin = dir.join("admin.sock");
        let extra = dir.join("admin.cfg");
        std::fs::write(&extra, format!("global\n    stats socket {} mode 600 level admin\n", admin.display())).unwrap();
        let mut last = String::new();
        for _ in 0..3 {
            let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let mut command = Command::new(haproxy);
            command.arg("-db").arg("-f").arg(repo().join("deploy/haproxy/haproxy.cfg")).arg("-f").arg(&extra);
            command.env("TTS_LISTEN", format!("127.0.0.1:{port}"));
            for (i, r) in replicas.iter().enumerate() {
                command.env(format!("TTS_REPLICA_{}", i + 1), r.strip_prefix("http://").unwrap());
            }
            let log = dir.join("haproxy.log");
            let child = command.stdout(Stdio::null()).stderr(std::fs::File::create(&log).unwrap()).spawn().unwrap();
            let mut balancer = Balancer { child, base: format!("http://127.0.0.1:{port}"), admin: admin.clone() };
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(30) {
                if balancer.child.try_wait().unwrap().is_some() {
                    break;
                }
                if balancer.states().is_some_and(|s| s.len() == replicas.len() && s.iter().all(|(_, state)| state == "UP"))
                    && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
                {
                    return balancer;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            last = std::fs::read_to_string(&log).unwrap_or_default();
        }
        panic!("haproxy did not start with every replica up: {last}");
    }

    /// `show stat` from the admin socket: one map per row, by column name.
    fn stat(&self) -> Option<Vec<std::collections::HashMap<String, String>>> {
        use std::io::{Read, Write};
        let mut socket = std::os::unix::net::UnixStream::connect(&self.admin).ok()?;
        socket.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        socket.write_all(b"show stat\n").ok()?;
        let mut text = String::new();
        socket.read_to_string(&mut text).ok()?;
        let mut lines = text.lines();
        let header: Vec<String> = lines.next()?.strip_prefix("# ")?.split(',').map(str::to_string).collect();
        Some(lines.filter(|l| !l.is_empty()).map(|l| header.iter().cloned().zip(l.split(',').map(str::to_string)).collect()).collect())
    }

    /// Each server of the backend and its state: `UP`, `DOWN`, or on its
    /// way from one to the other (`UP 1/2`: one check failed, still sent
    /// requests; `DOWN 1/2`: one passed, still sent none).
    fn states(&self) -> Option<Vec<(String, String)>> {
        let rows = self.stat()?;
        Some(
            rows.iter()
                .filter(|r| r["pxname"] == "replicas" && r["svname"].starts_with("replica"))
                .map(|r| (r["svname"].clone(), r["status"].clone()))
                .collect(),
        )
    }

    fn state(&self, server: &str) -> String {
        self.states().unwrap_or_default().into_iter().find(|(name, _)| name == server).map(|(_, state)| state).unwrap_or_default()
    }

    /// The backend's counts of requests sent again after a failed
    /// connection or a 503 (`wretr`) and of those sent to another replica
    /// (`wredis`).
    fn retries(&self) -> (u64, u64) {
        let rows = self.stat().unwrap_or_default();
        let backend = rows.iter().find(|r| r["pxname"] == "replicas" && r["svname"] == "BACKEND").expect("the backend's row");
        (backend["wretr"].parse().unwrap_or(0), backend["wredis"].parse().unwrap_or(0))
    }
}

/// Speech requests answered 200 by this replica since it started.
fn speech_served(replica: &Serving) -> u64 {
    let (_, text) = get(&format!("{}/metrics", replica.base));
    sample(&text, "tts_http_requests_total{endpoint=\"speech\",status=\"200\"}").unwrap_or(0.0) as u64
}

/// Waits for `done`, failing after `limit` (a hang guard, not a timing check).
fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?} (hang guard)");
        std::thread::sleep(Duration::from_millis(20));
    }
}

const CLIENTS: usize = 3;
/// The most requests a client sends (the run ends earlier, once the
/// restarted replica has served its share).
const MAX_REQUESTS_PER_CLIENT: usize = 3000;
const SPEECH: &str = r#"{"model": "supertonic", "input": "Hello from behind the balancer. A second sentence.", "voice": "F1", "response_format": "wav"}"#;

/// Three replicas behind HAProxy (health checks on /health), three clients
/// sending speech requests through it; one replica is stopped with SIGTERM
/// (it drains) and started again on its port mid-run, twice. Every request
/// must come back 200 with the same bytes as a replica's own answer, HAProxy
/// must take the replica out and put it back, and the restarted replica
/// must serve again. (Before the config had `option http-buffer-request`,
/// a restart at once lost a request in some runs: the 503 of the replica
/// still loading reached the client. The next test shows that case every
/// time.)
#[test]
fn three_replicas_behind_haproxy_answer_every_request_across_a_restart() {
    let Some(haproxy) = haproxy() else { return };
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let profile = supertonic_profile(dir.path());
    let args = ["--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap()];
    let mut replicas: Vec<Serving> = (0..3).map(|_| start_serve(&args)).collect();
    let addresses: Vec<String> = replicas.iter().map(|r| r.base.clone()).collect();
    let balancer = Balancer::start(&haproxy, dir.path(), &addresses);

    // The answer every request must get: the replicas run the same model
    // with the same seed, so any one of them gives these bytes.
    let reference = {
        let mut r = agent().post(format!("{}/v1/audio/speech", addresses[0])).header("Content-Type", "application/json").send(SPEECH).unwrap();
        assert_eq!(r.status().as_u16(), 200);
        r.body_mut().with_config().limit(64 << 20).read_to_vec().unwrap()
    };
    assert!(reference.len() > 44, "a WAV with audio");

    let stop_clients = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (stop_clients, answered, failures, reference, url) =
                (stop_clients.clone(), answered.clone(), failures.clone(), reference.clone(), format!("{}/v1/audio/speech", balancer.base));
            std::thread::spawn(move || {
                // One agent per client: its connection to HAProxy is kept
                // alive between requests, as a real client's would be.
                let agent = agent();
                for _ in 0..MAX_REQUESTS_PER_CLIENT {
                    if stop_clients.load(Ordering::Relaxed) {
                        break;
                    }
                    let outcome = agent.post(&url).header("Content-Type", "application/json").send(SPEECH).map_err(|e| e.to_string()).and_then(|mut r| {
                        let status = r.status().as_u16();
                        let body = r.body_mut().with_config().limit(64 << 20).read_to_vec().map_err(|e| e.to_string())?;
                        match (status, body == reference) {
                            (200, true) => Ok(()),
                            (200, false) => Err(format!("200 with {} bytes unlike the reference's {}", body.len(), reference.len())),
                            _ => Err(format!("{status}: {}", String::from_utf8_lossy(&body))),
                        }
                    });
                    answered.fetch_add(1, Ordering::Relaxed);
                    if let Err(e) = outcome {
                        failures.lock().unwrap().push(e);
                    }
                }
            })
        })
        .collect();
    let count = || answered.load(Ordering::Relaxed);
    let guard = Duration::from_secs(120);
    let port: u16 = addresses[1].rsplit(':').next().unwrap().parse().unwrap();
    wait_for("the first requests through the balancer", guard, || count() >= 30);
    let mut phases = Vec::new();
    // First as an operator restarts a replica (the health checks take it
    // out, requests go on without it, it comes back); then as a supervisor
    // restarts a process at once, before the checks have seen it go: the
    // requests it refuses while it drains, is gone and loads are sent again
    // to the others.
    for wait_until_out in [true, false] {
        assert!(speech_served(&replicas[1]) > 0, "replica 2 served nothing before it was stopped");
        let at_stop = count();
        let status = replicas[1].stop();
        assert!(status.success(), "the drained replica's exit: {status}");
        if wait_until_out {
            wait_for("HAProxy taking the stopped replica out", guard, || balancer.state("replica2") == "DOWN");
            let at_down = count();
            wait_for("requests while a replica is out", guard, || count() >= at_down + 30);
        }
        let at_restart = count();
        replicas[1] = start_serve_on(port, &args);
        wait_for("HAProxy putting the restarted replica back", guard, || balancer.state("replica2") == "UP");
        wait_for("the restarted replica serving through the balancer", guard, || speech_served(&replicas[1]) >= 10);
        phases.push(format!("{} from the stop to the restart, {} after", at_restart - at_stop, count() - at_restart));
    }
    stop_clients.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let elapsed = started.elapsed();
    let (retried, redispatched) = balancer.retries();
    let failures = failures.lock().unwrap();
    let total = count();
    println!(
        "{total} requests by {CLIENTS} clients in {elapsed:.1?}; taken out, then restarted: {}; restarted at once: {}; \
         HAProxy retried {retried} and sent {redispatched} to another replica; {} failed",
        phases[0],
        phases[1],
        failures.len()
    );
    assert!(failures.is_empty(), "{} of {total} requests failed, first: {:?}", failures.len(), &failures[..failures.len().min(5)]);
    assert!(total < CLIENTS * MAX_REQUESTS_PER_CLIENT, "the run reached its cap before the restarted replica served");
    for (i, r) in replicas.iter().enumerate().filter(|(i, _)| *i != 1) {
        assert!(speech_served(r) > 0, "replica {} served nothing", i + 1);
    }
}

/// A stand-in for a replica that is loading or draining: `/health` is 200
/// (the checks have not seen it change yet) and every other request gets
/// `tts serve`'s 503 as soon as its head has arrived, before its body is
/// read, and the connection closes. Counts the requests it refused.
fn refusing_replica() -> (String, Arc<AtomicUsize>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let refused = Arc::new(AtomicUsize::new(0));
    let counter = refused.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let counter = counter.clone();
            std::thread::spawn(move || {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut first = String::new();
                let _ = reader.read_line(&mut first);
                // The rest of the head, up to its blank line.
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    line.clear();
                }
                let (status, body) = if first.starts_with("GET /health ") {
                    ("200 OK", r#"{"status":"ok"}"#)
                } else {
                    counter.fetch_add(1, Ordering::Relaxed);
                    ("503 Service Unavailable", r#"{"error":{"message":"the models are still loading","type":"server_error","param":null,"code":null}}"#)
                };
                let _ =
                    write!(stream, "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            });
        }
    });
    (format!("http://{address}"), refused)
}

/// A speech request whose body follows its head in a second write, as
/// clients send it (ureq, for one): the status and body of the answer.
fn speech_in_two_writes(base: &str) -> (u16, Vec<u8>) {
    use std::io::{Read, Write};
    let address = base.strip_prefix("http://").unwrap();
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    stream.set_nodelay(true).unwrap();
    write!(
        stream,
        "POST /v1/audio/speech HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        SPEECH.len()
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    stream.write_all(SPEECH.as_bytes()).unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let head_end = response.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head") + 4;
    let status = String::from_utf8_lossy(&response[..head_end]).split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, response[head_end..].to_vec())
}

/// A replica that refuses a request before reading its body (loading, or
/// draining, while the health checks still count it in) gets requests, and
/// each is sent again to another replica: the client sees only 200s. Only
/// a request HAProxy holds whole can be sent again; without `option
/// http-buffer-request` every request that reached this replica came back
/// to its client as the 503.
#[test]
fn haproxy_sends_a_request_refused_before_its_body_was_read_to_another_replica() {
    let Some(haproxy) = haproxy() else { return };
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let profile = supertonic_profile(dir.path());
    let replica = start_serve(&["--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap()]);
    let (refusing, refused) = refusing_replica();
    // The working replica twice over (two server lines, one process).
    let balancer = Balancer::start(&haproxy, dir.path(), &[replica.base.clone(), refusing, replica.base.clone()]);
    const REQUESTS: usize = 30;
    for i in 0..REQUESTS {
        let (status, body) = speech_in_two_writes(&balancer.base);
        assert_eq!(status, 200, "request {i}: {}", String::from_utf8_lossy(&body));
        assert!(body.len() > 44, "request {i}: {} bytes", body.len());
    }
    let refused = refused.load(Ordering::Relaxed);
    println!("{REQUESTS} requests: {refused} refused by the stand-in replica and sent again");
    assert!(refused > 0, "no request reached the refusing replica");
}
