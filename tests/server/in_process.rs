//! Tollgate in this test process: the library's [`tollgate::run`] on loopback listeners
//! bound here, on a runtime of its own, asked with the same clients as a process (a
//! [`Running`] derefs to its [`Listening`] addresses). For the tests where a process adds
//! nothing; the command line, the environment, signals and logs are tested on processes.

use std::net::TcpListener;
use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;

use tokio::sync::oneshot;
use tollgate::{Config, Listeners};
use tollgate_testkit::loopback;
use tollgate_testkit::tollgate::{ConfigDir, Listening};

/// How to start one in-process server: `tollgate serve`'s arguments and environment.
pub struct InProcess {
    args: Vec<String>,
    env: Vec<(String, String)>,
    config: Option<ConfigDir>,
}

impl InProcess {
    /// Serves `yaml` as the only rule file.
    pub fn rules(yaml: &str) -> Self {
        let config = ConfigDir::with_file("rules.yaml", yaml);
        Self::path(&config.file("rules.yaml")).keep(config)
    }

    /// Serves the rule file or directory at `config`.
    pub fn path(config: &Path) -> Self {
        let path = config.display().to_string();
        Self::from_env().args(["--config", path.as_str()])
    }

    /// No rules path: the environment says where the rules come from (xDS).
    pub fn from_env() -> Self {
        // As the testkit's processes: no debug port on the reference's fixed 6070, and
        // `LEASES=false cargo test` runs a suite with leasing off.
        let mut env = vec![("DEBUG_PORT".to_owned(), "off".to_owned())];
        if let Ok(leases) = std::env::var("LEASES") {
            env.push(("LEASES".to_owned(), leases));
        }
        Self {
            args: Vec::new(),
            env,
            config: None,
        }
    }

    /// Keeps `config` until the server is gone.
    pub fn keep(mut self, config: ConfigDir) -> Self {
        self.config = Some(config);
        self
    }

    pub fn args<S: AsRef<str>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Starts the server on two loopback listeners bound here; panics with the startup
    /// error if its settings are refused.
    pub fn start(self) -> Running {
        let bind = || TcpListener::bind(loopback(0)).expect("bind a loopback listener");
        let (grpc, http) = (bind(), bind());
        let addrs = Listening {
            grpc: grpc.local_addr().expect("the gRPC listener's address"),
            http: http.local_addr().expect("the HTTP listener's address"),
        };
        let (checked_tx, checked) = mpsc::channel();
        let (kill, killed) = oneshot::channel::<()>();
        let Self { args, env, config } = self;
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("a runtime for the in-process server");
            runtime.block_on(async move {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let env: Vec<(&str, &str)> =
                    env.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
                let config = match Config::from_command_line(&args, &env).await {
                    Ok(config) => config,
                    Err(e) => {
                        let _ = checked_tx.send(Err(format!("{e:#}")));
                        return;
                    }
                };
                let _ = checked_tx.send(Ok(()));
                let listeners = Listeners::Bound { grpc, http };
                tokio::select! {
                    served = tollgate::run(config, listeners, std::future::pending()) => {
                        if let Err(e) = served {
                            eprintln!("the in-process tollgate stopped: {e:#}");
                        }
                    }
                    _ = killed => {}
                }
            });
            // As a killed process: whatever still runs is dropped, not drained.
            runtime.shutdown_background();
        });
        match checked.recv() {
            Ok(Ok(())) => Running {
                addrs,
                kill: Some(kill),
                thread: Some(thread),
                _config: config,
            },
            Ok(Err(refused)) => panic!("the in-process tollgate refused to start: {refused}"),
            Err(_) => panic!("the in-process tollgate's thread ended before it started"),
        }
    }
}

/// A server running in this process; stopped when dropped.
pub struct Running {
    addrs: Listening,
    kill: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    _config: Option<ConfigDir>,
}

impl std::ops::Deref for Running {
    type Target = Listening;

    fn deref(&self) -> &Listening {
        &self.addrs
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
