//! Headless Chromium for the dashboard's tests, driven over the W3C WebDriver protocol through
//! chromedriver (both Debian packages: `chromium`, `chromium-driver`). The protocol is plain HTTP
//! and JSON, so a few calls with reqwest are all the client there is.
//!
//! Missing browsers are installed with apt when the tests run as root (as CI does); otherwise the
//! test stops with the command to run.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The W3C key under which an element reference comes back.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Installs Chromium and chromedriver if they are missing and we are root.
pub fn ensure_installed() {
    if Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists() {
        return;
    }
    assert!(
        nix::unistd::geteuid().is_root(),
        "headless Chromium is missing: run `sudo apt-get install -y chromium chromium-driver`"
    );
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-q", "chromium", "chromium-driver"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    if !install() {
        let _ = Command::new("apt-get").args(["update", "-q"]).status();
        assert!(
            install(),
            "apt-get install -y chromium chromium-driver failed"
        );
    }
}

/// One headless Chromium session. Dropping it ends the session and chromedriver.
#[derive(Debug)]
pub struct Browser {
    /// With the Chromium it starts: killing chromedriver alone would leave Chromium behind.
    driver: crate::ChildGuard,
    base: String,
    session: String,
    http: reqwest::Client,
    _profile: TempDir,
    /// chromedriver's log, kept only if the test fails.
    log: std::path::PathBuf,
}

/// A directory removed on drop (Chromium's profile).
#[derive(Debug)]
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Browser {
    pub async fn start() -> Browser {
        ensure_installed();
        let port = crate::free_port();
        let log_path = crate::log_dir().join(format!("chromedriver-{port}.log"));
        let log = crate::open_log(&log_path);
        let mut command = Command::new(CHROMEDRIVER);
        command
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap_or_else(|err| panic!("{err}")))
            .stderr(log);
        let driver = crate::ChildGuard::spawn(command, nix::sys::signal::Signal::SIGKILL)
            .unwrap_or_else(|err| panic!("cannot start chromedriver: {err}"));
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap_or_else(|err| panic!("{err}"));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(answer) = http.get(format!("{base}/status")).send().await
                && let Ok(status) = answer.json::<Value>().await
                && status["value"]["ready"] == true
            {
                break;
            }
            assert!(Instant::now() < deadline, "chromedriver did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile =
            std::env::temp_dir().join(format!("leasehold-chromium-{}-{port}", std::process::id()));
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--disable-quic", "--no-first-run", "--disable-background-networking",
                         "--disable-component-update", "--disable-sync", "--window-size=1280,1000",
                         format!("--user-data-dir={}", profile.display())]
            }
        }}});
        let answer: Value = http
            .post(format!("{base}/session"))
            .json(&capabilities)
            .send()
            .await
            .unwrap_or_else(|err| panic!("new session: {err}"))
            .json()
            .await
            .unwrap_or_else(|err| panic!("new session: {err}"));
        let session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {answer}"))
            .to_owned();
        Browser {
            driver,
            base,
            session,
            http,
            _profile: TempDir(profile),
            log: log_path,
        }
    }

    async fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut request = self.http.request(method, &url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer: Value = request
            .send()
            .await
            .unwrap_or_else(|err| panic!("{path}: {err}"))
            .json()
            .await
            .unwrap_or_else(|err| panic!("{path}: {err}"));
        if let Some(error) = answer["value"]["error"].as_str() {
            panic!("WebDriver {path}: {error}: {}", answer["value"]["message"]);
        }
        answer["value"].clone()
    }

    /// Ends the session (Chromium exits) and then chromedriver.
    pub async fn quit(self) {
        let url = format!("{}/session/{}", self.base, self.session);
        let _ = self.http.delete(url).send().await;
    }

    pub async fn goto(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    /// Resizes the window (WebDriver's window rect), as a phone's or a narrow pane's would be.
    pub async fn resize(&self, width: u32, height: u32) {
        self.command(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({"width": width, "height": height})),
        )
        .await;
    }

    /// Clicks the element `css` selects, as a user would (WebDriver's element click).
    pub async fn click(&self, css: &str) {
        let found = self
            .command(
                reqwest::Method::POST,
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        let id = found[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}"))
            .to_owned();
        self.command(
            reqwest::Method::POST,
            &format!("/element/{id}/click"),
            Some(json!({})),
        )
        .await;
    }

    /// Runs `script` (a function body; `arguments` holds `args`) in the page.
    pub async fn execute(&self, script: &str, args: Value) -> Value {
        self.command(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
        .await
    }

    /// The text of the first element `css` selects, or `None`.
    pub async fn text(&self, css: &str) -> Option<String> {
        self.execute(
            "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;",
            json!([css]),
        )
        .await
        .as_str()
        .map(str::to_owned)
    }

    /// Waits until the text of `css` satisfies `check`; returns it.
    pub async fn wait_for_text(
        &self,
        css: &str,
        timeout: Duration,
        check: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(text) = self.text(css).await
                && check(&text)
            {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "{css} never matched; it reads {:?}",
                self.text(css).await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The errors the page recorded (`window.__errors`).
    pub async fn page_errors(&self) -> Vec<String> {
        let errors = self
            .execute("return window.__errors || [];", json!([]))
            .await;
        errors
            .as_array()
            .map(|list| list.iter().map(|e| e.to_string()).collect())
            .unwrap_or_default()
    }

    /// Saves a PNG of the whole page, top to bottom, to `path`: the window grows to the page's
    /// height for the shot (WebDriver's screenshot is of the window alone), then returns to its
    /// size. For the book's screenshots, whose captions name everything a view shows.
    pub async fn screenshot_page(&self, path: &Path) {
        let height = self
            .execute(
                "window.scrollTo(0, 0); return Math.ceil(document.documentElement.scrollHeight);",
                json!([]),
            )
            .await
            .as_u64()
            .unwrap_or(1000);
        let height = u32::try_from(height.clamp(1000, 6000)).unwrap_or(1000);
        self.resize(1280, height + 120).await;
        self.screenshot(path).await;
        self.resize(1280, 1000).await;
    }

    /// Saves a PNG of the window to `path`.
    pub async fn screenshot(&self, path: &Path) {
        use base64::Engine;
        let encoded = self
            .command(reqwest::Method::GET, "/screenshot", None)
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().unwrap_or(""))
            .unwrap_or_else(|err| panic!("screenshot: {err}"));
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        std::fs::write(path, png).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.driver.kill_tree();
        crate::discard_log(&self.log);
    }
}
