//! Running external commands the way every xtask step wants them run: echoed first (with the
//! environment overrides that matter), stdin closed so nothing can wait for a keyboard, and an
//! optional time limit after which the child is killed, so a hang fails instead of stalling CI.

use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The error type of xtask: a message for the user.
pub type Error = Box<dyn std::error::Error>;

/// Result with xtask's error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The cargo to shell out to: `$CARGO` (the one that ran xtask), else `cargo` from PATH.
pub fn cargo() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// How a finished command ended.
#[derive(Debug)]
pub enum Outcome {
    /// The process exited (successfully or not).
    Exited(ExitStatus),
    /// The process ran past its time limit and was killed.
    TimedOut(Duration),
}

impl Outcome {
    /// Whether the process exited with status 0.
    pub fn success(&self) -> bool {
        matches!(self, Outcome::Exited(status) if status.success())
    }

    /// A short description for error messages ("exit status: 1", "killed after 1200 s").
    pub fn describe(&self) -> String {
        match self {
            Outcome::Exited(status) => status.to_string(),
            Outcome::TimedOut(limit) => {
                format!("killed after the {} s time limit", limit.as_secs())
            }
        }
    }
}

/// A command to run, built up like [`std::process::Command`] but remembering what it will echo.
pub struct Cmd {
    program: OsString,
    args: Vec<OsString>,
    env: Vec<(OsString, Option<OsString>)>,
    cwd: Option<PathBuf>,
    timeout: Option<Duration>,
}

impl Cmd {
    /// A command running `program` with no arguments yet.
    pub fn new(program: impl AsRef<OsStr>) -> Self {
        Self {
            program: program.as_ref().to_owned(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: None,
            timeout: None,
        }
    }

    /// `cargo` (see [`cargo`]) followed by `args`.
    pub fn cargo<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> Self {
        Self::new(cargo()).args(args)
    }

    /// Appends one argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    /// Appends several arguments.
    pub fn args<S: AsRef<OsStr>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Sets an environment variable for the child.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_owned(), Some(value.as_ref().to_owned())));
        self
    }

    /// Removes an environment variable for the child.
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Self {
        self.env.push((key.as_ref().to_owned(), None));
        self
    }

    /// Runs the child in `dir` instead of the workspace root.
    pub fn cwd(mut self, dir: impl AsRef<Path>) -> Self {
        self.cwd = Some(dir.as_ref().to_path_buf());
        self
    }

    /// Kills the child when it runs longer than `limit`.
    pub fn timeout(mut self, limit: Duration) -> Self {
        self.timeout = Some(limit);
        self
    }

    /// The command line as echoed: environment overrides, program, arguments.
    pub fn display(&self) -> String {
        let mut line = String::new();
        for (key, value) in &self.env {
            match value {
                Some(v) => write!(line, "{}={} ", key.to_string_lossy(), quote(v)),
                None => write!(line, "-u {} ", key.to_string_lossy()),
            }
            .expect("writing to a String cannot fail");
        }
        line.push_str(&quote(&self.program));
        for arg in &self.args {
            line.push(' ');
            line.push_str(&quote(arg));
        }
        if let Some(dir) = &self.cwd {
            write!(line, "   (in {})", dir.display()).expect("writing to a String cannot fail");
        }
        line
    }

    /// The time limit set with [`Cmd::timeout`], if any.
    pub fn time_limit(&self) -> Option<Duration> {
        self.timeout
    }

    /// The [`std::process::Command`] this runs (stdin closed), for callers that need their own
    /// handling of the child's output.
    pub fn std_command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args).stdin(Stdio::null());
        for (key, value) in &self.env {
            match value {
                Some(v) => command.env(key, v),
                None => command.env_remove(key),
            };
        }
        if let Some(dir) = &self.cwd {
            command.current_dir(dir);
        }
        command
    }

    fn spawn(&self, command: &mut Command) -> Result<Child> {
        command
            .spawn()
            .map_err(|e| format!("cannot start `{}`: {e}", self.display()).into())
    }

    /// Echoes and runs the command with inherited stdout/stderr; fails unless it exits with 0.
    pub fn run(&self) -> Result<()> {
        let outcome = self.run_outcome()?;
        if outcome.success() {
            Ok(())
        } else {
            Err(format!("`{}` failed: {}", self.display(), outcome.describe()).into())
        }
    }

    /// Echoes and runs the command with inherited stdout/stderr; returns how it ended.
    pub fn run_outcome(&self) -> Result<Outcome> {
        println!("$ {}", self.display());
        let mut child = self.spawn(&mut self.std_command())?;
        wait_with_limit(&mut child, self.timeout)
    }

    /// Echoes and runs the command, copying each stdout line to our stdout behind `prefix` while
    /// keeping the text; stderr is inherited. Returns how it ended and what it printed.
    pub fn run_tee(&self, prefix: &str) -> Result<(Outcome, String)> {
        println!("$ {}", self.display());
        let mut child = self.spawn(self.std_command().stdout(Stdio::piped()))?;
        let stdout = child.stdout.take().expect("stdout was piped");
        let prefix = prefix.to_owned();
        let reader = thread::spawn(move || {
            let mut kept = String::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                println!("{prefix}{line}");
                kept.push_str(&line);
                kept.push('\n');
            }
            kept
        });
        let outcome = wait_with_limit(&mut child, self.timeout)?;
        let text = reader.join().unwrap_or_default();
        Ok((outcome, text))
    }

    /// Runs the command without echoing it and returns its stdout; fails unless it exits with 0.
    /// stderr is inherited, so diagnostics still reach the user.
    pub fn read_stdout(&self) -> Result<String> {
        let mut child = self.spawn(self.std_command().stdout(Stdio::piped()))?;
        let mut stdout = child.stdout.take().expect("stdout was piped");
        let reader = thread::spawn(move || {
            let mut text = String::new();
            let _ = stdout.read_to_string(&mut text);
            text
        });
        let outcome = wait_with_limit(&mut child, self.timeout)?;
        let text = reader.join().unwrap_or_default();
        if outcome.success() {
            Ok(text)
        } else {
            Err(format!("`{}` failed: {}", self.display(), outcome.describe()).into())
        }
    }
}

/// Waits for `child`, killing it once `limit` has passed.
fn wait_with_limit(child: &mut Child, limit: Option<Duration>) -> Result<Outcome> {
    let Some(limit) = limit else {
        return Ok(Outcome::Exited(child.wait()?));
    };
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Outcome::Exited(status));
        }
        if start.elapsed() >= limit {
            // The child may exit between the check and the kill; either way it is gone after wait.
            let _ = child.kill();
            let _ = child.wait();
            return Ok(Outcome::TimedOut(limit));
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Quotes a word for display when the shell would need it.
fn quote(word: &OsStr) -> String {
    let text = word.to_string_lossy();
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_=+./:,@%".contains(c));
    if plain {
        text.into_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

/// Formats a duration as `1m23s` (or `4.5s` under a minute) for banners and tables.
pub fn fmt_duration(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 60.0 {
        format!("{secs:.1}s")
    } else {
        let whole = d.as_secs();
        format!("{}m{:02}s", whole / 60, whole % 60)
    }
}

/// Prints a banner line that stands out in long CI logs.
pub fn banner(title: &str) {
    println!("\n======== {title} ========");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_shows_env_and_quotes() {
        let cmd = Cmd::new("qemu-aarch64")
            .env("QEMU_CPU", "max")
            .env_remove("RUSTFLAGS")
            .arg("a b");
        assert_eq!(
            cmd.display(),
            "QEMU_CPU=max -u RUSTFLAGS qemu-aarch64 'a b'"
        );
    }

    #[test]
    fn a_hang_is_killed_at_the_limit() {
        let outcome = Cmd::new("sleep")
            .arg("5")
            .timeout(Duration::from_millis(200))
            .run_outcome()
            .expect("sleep starts");
        assert!(matches!(outcome, Outcome::TimedOut(_)));
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(fmt_duration(Duration::from_millis(4500)), "4.5s");
        assert_eq!(fmt_duration(Duration::from_secs(83)), "1m23s");
    }
}
