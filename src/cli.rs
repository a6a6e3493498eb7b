//! The command line: `serve` (the daemon), `check-config`, `extract` (one note or a
//! manifest of many), `demo`, and the shell completions and man pages generated from
//! this definition (`completions`, `manpage`).

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};

use crate::config::{self, Config};
use crate::extract::{self, Document, ExtractError, Limits, NoteError, Surface, View};
use crate::logging;
use crate::path;
use crate::proxy::{self, StartError};
use crate::telemetry::trace;

/// Raw files larger than this are refused before reading: the body cap is 1,000,000
/// UTF-16 units (at most 3,000,000 UTF-8 bytes) and frontmatter rarely adds much.
pub const MAX_RAW_FILE_BYTES: u64 = 8 * 1024 * 1024;

/// Exit status for bad input (a file or note that cannot be processed).
const EXIT_FAILURE: u8 = 1;

/// Exit status for an invalid configuration (EX_USAGE), before any port is bound.
pub const EXIT_CONFIG: u8 = 64;

/// What `--version` prints after the name: the version, the commit and the compiler
/// (`build.rs`; `unknown` where the build could not tell).
pub const VERSION_LINE: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("KNOWTATION_SIDECAR_COMMIT"),
    ", rustc ",
    env!("KNOWTATION_SIDECAR_RUSTC"),
    ")"
);

#[derive(Parser, Debug)]
#[command(name = "knowtation-sidecar", version = VERSION_LINE, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the sidecar until SIGTERM or SIGINT, then drain and exit 0; SIGHUP reloads the
    /// configuration.
    Serve(ConfigArgs),
    /// Validate the configuration and print it as TOML, secrets redacted.
    CheckConfig(ConfigArgs),
    /// Print a body-free view of Markdown notes (SectionSource v0 by default, NoteOutline
    /// v1 or DocumentTree v0), exactly as the gateway serves it.
    Extract(ExtractArgs),
    /// Run the sidecar in front of an embedded demo gateway (notes compiled in).
    Demo(DemoArgs),
    /// Print the shell completion script for SHELL (e.g. into
    /// /usr/share/bash-completion/completions/knowtation-sidecar).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page, or write one page per command into DIR.
    Manpage {
        /// Write knowtation-sidecar.1 and a page per subcommand here instead.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[derive(clap::Args, Debug)]
struct DemoArgs {
    /// Where the sidecar listens.
    #[arg(long, value_name = "ADDR", default_value_t = crate::demo::LISTEN)]
    listen: std::net::SocketAddr,
    /// Where the admin endpoints listen.
    #[arg(long, value_name = "ADDR", default_value_t = crate::demo::ADMIN)]
    admin: std::net::SocketAddr,
    /// Run only the mock upstreams, for a trial of `serve`: write a configuration pointing
    /// at them into --dir (listening on --listen and --admin), with its secrets in files
    /// of mode 0600, and print the `serve` command and a token.
    #[arg(long, requires = "dir")]
    upstreams_only: bool,
    /// Where --upstreams-only writes config.toml, jwt_secrets and gateway_secret
    /// (created mode 0700 if missing).
    #[arg(long, value_name = "DIR", requires = "upstreams_only")]
    dir: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct ConfigArgs {
    /// TOML config file (default: /etc/knowtation-sidecar/config.toml, if it exists).
    /// Environment variables KNOWTATION_SIDECAR_<SECTION>__<KEY> override it.
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
#[command(
    group(clap::ArgGroup::new("input").required(true).args(["file", "stored", "manifest"])),
    override_usage = "knowtation-sidecar extract [--view <VIEW>] --path <PATH> <FILE>\n       \
                      knowtation-sidecar extract [--view <VIEW>] --path <PATH> --stored <NOTE.json> [--surface <SURFACE>]\n       \
                      knowtation-sidecar extract [--view <VIEW>] --manifest <TSV>"
)]
struct ExtractArgs {
    /// Vault-relative path of the note (validated like the proxy validates it); needed
    /// with FILE or --stored.
    #[arg(long, conflicts_with = "manifest")]
    path: Option<String>,
    /// A raw Markdown file (YAML frontmatter split off first); `-` reads standard input.
    #[arg(requires = "path")]
    file: Option<PathBuf>,
    /// A canister note JSON (`{"path","frontmatter","body"}`) instead of a raw file; `-`
    /// reads standard input.
    #[arg(
        long,
        value_name = "NOTE.json",
        conflicts_with = "file",
        requires = "path"
    )]
    stored: Option<PathBuf>,
    /// Which surface's note decoding to apply to `--stored` [default: mcp].
    #[arg(long, value_enum)]
    surface: Option<SurfaceArg>,
    /// A TSV (header `id`, `path`, `file`) of many raw files; one JSON line per row.
    #[arg(long, value_name = "TSV", conflicts_with_all = ["file", "stored"])]
    manifest: Option<PathBuf>,
    /// Which view to print.
    #[arg(long, value_enum, default_value_t = ViewArg::SectionSource)]
    view: ViewArg,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum ViewArg {
    SectionSource,
    NoteOutline,
    DocumentTree,
}

impl From<ViewArg> for View {
    fn from(v: ViewArg) -> View {
        match v {
            ViewArg::SectionSource => View::SectionSource,
            ViewArg::NoteOutline => View::NoteOutline,
            ViewArg::DocumentTree => View::DocumentTree,
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum SurfaceArg {
    Rest,
    Mcp,
}

impl From<SurfaceArg> for Surface {
    fn from(s: SurfaceArg) -> Surface {
        match s {
            SurfaceArg::Rest => Surface::Rest,
            SurfaceArg::Mcp => Surface::Mcp,
        }
    }
}

/// Runs the command line; returns the process exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => run_serve(args),
        Command::CheckConfig(args) => run_check_config(args),
        Command::Extract(args) => run_extract(args),
        Command::Demo(args) => run_demo(args),
        Command::Completions { shell } => run_completions(shell),
        Command::Manpage { dir } => run_manpage(dir.as_deref()),
    }
}

/// The command line definition, as the completions and man pages describe it.
pub fn command() -> clap::Command {
    Cli::command()
}

fn run_completions(shell: clap_complete::Shell) -> ExitCode {
    let mut cmd = command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "knowtation-sidecar", &mut out);
    write_stdout(&out)
}

fn run_manpage(dir: Option<&Path>) -> ExitCode {
    let cmd = command();
    let Some(dir) = dir else {
        let mut out = Vec::new();
        if let Err(e) = clap_mangen::Man::new(cmd).render(&mut out) {
            eprintln!("error: rendering the man page: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
        return write_stdout(&out);
    };
    match clap_mangen::generate_to(cmd, dir) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: writing man pages to {}: {e}", dir.display());
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// Writes `bytes` to standard output; a closed pipe is an error like any other.
fn write_stdout(bytes: &[u8]) -> ExitCode {
    let mut out = io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: writing output: {e}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// The demo needs a runtime; the rest of the command line is synchronous.
fn run_demo(args: DemoArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("demo: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    let at = crate::demo::Addresses {
        listen: args.listen,
        admin: args.admin,
    };
    let ran = match (args.upstreams_only, &args.dir) {
        (true, Some(dir)) => runtime.block_on(crate::demo::run_upstreams_only(at, dir)),
        _ => runtime.block_on(crate::demo::run(at)),
    };
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo: {e}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// What to say when no configuration file was read: an operator who expected one should
/// not have to guess why every key is at its default.
fn no_file_note() -> String {
    format!(
        "note: no configuration file was read (no --config given, and {} does not exist): \
         the built-in defaults and {}* variables only",
        config::DEFAULT_CONFIG_PATH,
        config::ENV_PREFIX
    )
}

/// Loads the config or explains on stderr why not.
fn load_config(args: &ConfigArgs) -> Result<Config, ExitCode> {
    let file = config::resolve_file(args.config.as_deref());
    config::load(file.as_deref()).map_err(|e| {
        if file.is_none() {
            eprintln!("{}", no_file_note());
        }
        eprintln!("error: invalid configuration: {e}");
        ExitCode::from(EXIT_CONFIG)
    })
}

fn run_check_config(args: ConfigArgs) -> ExitCode {
    let config = match load_config(&args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    // Everything `serve` checks and builds before binding: the state directory, files,
    // TLS, the policy, the clients.
    if let Err(e) = proxy::check(&config) {
        eprintln!("error: invalid configuration: {e}");
        return ExitCode::from(EXIT_CONFIG);
    }
    if config::resolve_file(args.config.as_deref()).is_none() {
        eprintln!("{}", no_file_note());
    }
    // The warnings `serve` logs at start, in the same words.
    for w in config::warnings(&config) {
        eprintln!("warning: {}: {}: {}", w.key, w.message, w.effect);
    }
    let mut out = io::stdout().lock();
    match out
        .write_all(config::to_toml(&config).as_bytes())
        .and_then(|()| out.flush())
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: writing output: {e}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

fn run_serve(args: ConfigArgs) -> ExitCode {
    let config = match load_config(&args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let threads = crate::worker::count_here(config.runtime.threads);
    // The control thread's event loop: signals, reloads, the admin listener, the gateway
    // probe, trace export. Requests are served by the workers `proxy::start` starts.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    // After the runtime: the trace exporter sends on it.
    let (exporter, tracer) = match trace::Exporter::start(&config.tracing, runtime.handle().clone())
    {
        Ok(Some((exporter, tracer))) => (Some(exporter), Some(tracer)),
        Ok(None) => (None, None),
        Err(e) => {
            eprintln!("error: invalid configuration: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Err(e) = logging::init(&config.log, tracer) {
        eprintln!("error: invalid configuration: {e}");
        return ExitCode::from(EXIT_CONFIG);
    }
    runtime.block_on(async {
        let code = serve(config, args, threads).await;
        if let Some(exporter) = exporter {
            exporter.shutdown().await;
        }
        code
    })
}

async fn serve(config: Config, args: ConfigArgs, threads: usize) -> ExitCode {
    // Handlers go in before anything is announced, so an early SIGTERM still drains.
    let mut signals = match Signals::register() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot listen for signals: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    let running = match proxy::start(config).await {
        Ok(r) => r,
        Err(StartError::Config(e)) => {
            eprintln!("error: invalid configuration: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    tracing::info!(
        listen = %running.listen_addr,
        admin = %running.admin_addr,
        threads,
        version = env!("CARGO_PKG_VERSION"),
        commit = env!("KNOWTATION_SIDECAR_COMMIT"),
        "started"
    );
    if config::resolve_file(args.config.as_deref()).is_none() {
        tracing::warn!(
            path = config::DEFAULT_CONFIG_PATH,
            "no configuration file was read (no --config given, and the default file does \
             not exist): the built-in defaults and the environment only"
        );
    }
    while signals.recv().await == Signal::Reload {
        tracing::info!("SIGHUP: reloading the configuration");
        // The same sources as at start: the file, then the environment.
        let _ = running.reload(config::load(args.config.as_deref()));
    }
    tracing::info!("shutting down");
    running.shutdown();
    match running.wait().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "shutdown failed");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// What a signal asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    /// SIGTERM or SIGINT: drain and exit.
    Stop,
    /// SIGHUP: reload the configuration.
    Reload,
}

/// SIGTERM, SIGINT and SIGHUP, registered at once.
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
    #[cfg(unix)]
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn register() -> io::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Signals {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
                hup: signal(SignalKind::hangup())?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(Signals {})
        }
    }

    /// The next one.
    async fn recv(&mut self) -> Signal {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.term.recv() => Signal::Stop,
                _ = self.int.recv() => Signal::Stop,
                _ = self.hup.recv() => Signal::Reload,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            Signal::Stop
        }
    }
}

/// Why one note produced no document; the manifest prints its class, the command line
/// the message, which names the input and, for a cap, the cap.
#[derive(Debug, thiserror::Error)]
pub enum NoteFailure {
    /// The vault path fails the validator (wire contract §3).
    #[error("invalid path: {0}")]
    InvalidPath(#[from] path::PathError),
    /// Over the file-size cap or the body cap: which input, how large, which cap.
    #[error("{0}")]
    TooLarge(String),
    /// Missing, not a file, unreadable, not UTF-8, or a note the builder rejects.
    #[error("{0}")]
    Unreadable(String),
}

impl NoteFailure {
    /// The manifest's error class.
    pub fn class(&self) -> &'static str {
        match self {
            NoteFailure::InvalidPath(_) => "invalid_path",
            NoteFailure::TooLarge(_) => "too_large",
            NoteFailure::Unreadable(_) => "unreadable",
        }
    }
}

/// The builder's refusal of `body`, read from `name`, in the command line's words.
fn build_failure(name: &str, body: &str, e: ExtractError) -> NoteFailure {
    match e {
        ExtractError::TooLarge => {
            let units = body.encode_utf16().count();
            NoteFailure::TooLarge(format!(
                "{name}: too large: the body is {} ({} characters), over the {}-character \
                 body cap",
                megabytes(body.len() as u64),
                thousands(units as u64),
                thousands(Limits::default().max_input_units as u64),
            ))
        }
        other => NoteFailure::Unreadable(format!("{name}: {other}")),
    }
}

/// `n` bytes in decimal megabytes with one decimal (`7.0 MB`).
fn megabytes(n: u64) -> String {
    let tenths = (n + 50_000) / 100_000;
    format!("{}.{} MB", tenths / 10, tenths % 10)
}

/// `n` with thousands separators (`1,000,000`).
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Whether `file` names standard input.
fn is_stdin(file: &Path) -> bool {
    file.as_os_str() == "-"
}

/// How messages name `file`.
fn input_name(file: &Path) -> String {
    if is_stdin(file) {
        "standard input".to_owned()
    } else {
        file.display().to_string()
    }
}

/// Why `file` could not be opened or read, told apart: missing, a directory, or the
/// system's own reason.
fn read_failure(name: &str, e: &io::Error) -> NoteFailure {
    let why = match e.kind() {
        io::ErrorKind::NotFound => "no such file".to_owned(),
        io::ErrorKind::IsADirectory => "is a directory, not a file".to_owned(),
        io::ErrorKind::PermissionDenied => "cannot read it: permission denied".to_owned(),
        _ => format!("cannot read it: {e}"),
    };
    NoteFailure::Unreadable(format!("{name}: {why}"))
}

fn run_extract(args: ExtractArgs) -> ExitCode {
    let view = View::from(args.view);
    // Checked here: clap lets `requires` pass when the argument it names is in a group.
    if args.surface.is_some() && args.stored.is_none() {
        let mut cli = command();
        cli.build();
        let extract = cli
            .find_subcommand_mut("extract")
            .cloned()
            .unwrap_or_default();
        extract
            .bin_name("knowtation-sidecar extract")
            .error(
                clap::error::ErrorKind::ArgumentConflict,
                "--surface applies to --stored only: it picks how a canister note is \
                 decoded, and a raw FILE or a --manifest has none",
            )
            .exit();
    }
    if let Some(manifest) = args.manifest {
        return match run_manifest_view(&manifest, view, &mut io::stdout().lock()) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(EXIT_FAILURE),
            Err(e) => {
                let name = input_name(&manifest);
                let why = match e.kind() {
                    io::ErrorKind::NotFound => "no such file".to_owned(),
                    io::ErrorKind::IsADirectory => "is a directory, not a file".to_owned(),
                    _ => e.to_string(),
                };
                eprintln!("error: manifest {name}: {why}");
                ExitCode::from(EXIT_FAILURE)
            }
        };
    }
    let vault_path = args.path.unwrap_or_default();
    let surface = args.surface.unwrap_or(SurfaceArg::Mcp);
    let result = match (&args.file, &args.stored) {
        (Some(file), _) => extract_file_view(&vault_path, file, view),
        (None, Some(note)) => extract_stored_view(&vault_path, note, surface.into(), view),
        (None, None) => Err(NoteFailure::Unreadable("no input given".into())),
    };
    match result {
        Ok(json) => {
            let mut out = io::stdout().lock();
            match writeln!(out, "{json}").and_then(|()| out.flush()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: writing output: {e}");
                    ExitCode::from(EXIT_FAILURE)
                }
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// Reads at most `MAX_RAW_FILE_BYTES` of a file, or of standard input for `-`, into
/// `buf` (emptied first, its capacity kept: a manifest reads many files into one buffer).
fn read_capped_into(file: &Path, buf: &mut Vec<u8>) -> Result<(), NoteFailure> {
    let name = input_name(file);
    buf.clear();
    let mut size = None;
    if is_stdin(file) {
        io::stdin()
            .lock()
            .take(MAX_RAW_FILE_BYTES + 1)
            .read_to_end(buf)
            .map_err(|e| read_failure(&name, &e))?;
    } else {
        let f = File::open(file).map_err(|e| read_failure(&name, &e))?;
        let meta = f.metadata().map_err(|e| read_failure(&name, &e))?;
        if meta.is_dir() {
            return Err(NoteFailure::Unreadable(format!(
                "{name}: is a directory, not a file"
            )));
        }
        size = meta.is_file().then_some(meta.len());
        // Room for the whole file up front, so it is read without regrowing the buffer.
        let room = size.unwrap_or(0).min(MAX_RAW_FILE_BYTES + 1);
        buf.reserve(usize::try_from(room).unwrap_or(0));
        f.take(MAX_RAW_FILE_BYTES + 1)
            .read_to_end(buf)
            .map_err(|e| read_failure(&name, &e))?;
    }
    if buf.len() as u64 > MAX_RAW_FILE_BYTES {
        let how_large = match size {
            Some(n) if n > MAX_RAW_FILE_BYTES => megabytes(n),
            _ => format!("more than {}", megabytes(MAX_RAW_FILE_BYTES)),
        };
        return Err(NoteFailure::TooLarge(format!(
            "{name}: too large: {how_large} is over the {} MiB ({}-byte) file cap",
            MAX_RAW_FILE_BYTES / (1024 * 1024),
            thousands(MAX_RAW_FILE_BYTES),
        )));
    }
    Ok(())
}

/// `bytes` as UTF-8, or a message naming the input and where the first bad byte is.
fn utf8<'a>(name: &str, bytes: &'a [u8]) -> Result<&'a str, NoteFailure> {
    std::str::from_utf8(bytes).map_err(|e| {
        NoteFailure::Unreadable(format!(
            "{name}: not UTF-8 (the first invalid byte is at offset {})",
            e.valid_up_to()
        ))
    })
}

/// Reads at most `MAX_RAW_FILE_BYTES` of a file.
fn read_capped(file: &Path) -> Result<Vec<u8>, NoteFailure> {
    let mut buf = Vec::new();
    read_capped_into(file, &mut buf)?;
    Ok(buf)
}

/// The SectionSource JSON of a raw Markdown file.
pub fn extract_file(vault_path: &str, file: &Path) -> Result<String, NoteFailure> {
    extract_file_view(vault_path, file, View::SectionSource)
}

/// The JSON of `view` of a raw Markdown file.
pub fn extract_file_view(vault_path: &str, file: &Path, view: View) -> Result<String, NoteFailure> {
    Ok(build_file(vault_path, file, view, &mut Vec::new())?.to_json())
}

/// `view` of a raw Markdown file, read through `buf`.
fn build_file(
    vault_path: &str,
    file: &Path,
    view: View,
    buf: &mut Vec<u8>,
) -> Result<Document, NoteFailure> {
    let vault_path = path::validate(vault_path)?;
    read_capped_into(file, buf)?;
    let name = input_name(file);
    let text = utf8(&name, buf)?;
    let limits = Limits::default();
    let built = match view {
        // The manifest's hot path, exactly as before the other views existed.
        View::SectionSource => {
            extract::build_from_raw(&vault_path, text, &limits).map(Document::SectionSource)
        }
        _ => extract::parse_from_raw(&vault_path, text, &limits)
            .and_then(|headings| headings.view_charged(view, &mut |_| true)),
    };
    built.map_err(|e| {
        let (_, body) = extract::yaml::split_raw(text);
        build_failure(&name, body, e)
    })
}

/// The SectionSource JSON of a canister note JSON, decoded as `surface` does.
pub fn extract_stored(
    vault_path: &str,
    note: &Path,
    surface: Surface,
) -> Result<String, NoteFailure> {
    extract_stored_view(vault_path, note, surface, View::SectionSource)
}

/// The JSON of `view` of a canister note JSON, decoded as `surface` does.
pub fn extract_stored_view(
    vault_path: &str,
    note: &Path,
    surface: Surface,
    view: View,
) -> Result<String, NoteFailure> {
    let vault_path = path::validate(vault_path)?;
    let bytes = read_capped(note)?;
    let name = input_name(note);
    utf8(&name, &bytes)?;
    let parsed = extract::parse_note(&bytes, surface).map_err(|e| {
        NoteFailure::Unreadable(match e {
            NoteError::Body => {
                format!("{name}: the note's `body` is not a string and cannot be converted to one")
            }
            NoteError::NotJson => format!("{name}: not a note: not JSON"),
            NoteError::Empty => format!("{name}: not a note: empty (the MCP surface refuses it)"),
            NoteError::Null => format!("{name}: not a note: `null` (the REST surface refuses it)"),
            other => format!("{name}: {other}"),
        })
    })?;
    if let Some(kind) = body_not_a_string(&bytes) {
        // The gateway converts it with String(); so does the extractor. Say so, since
        // the headings then come from that conversion.
        eprintln!(
            "warning: {name}: the note's `body` is {kind}, not a string; it is read as the \
             gateway reads it, converted with String()"
        );
    }
    extract::build_view_charged(
        view,
        &vault_path,
        &parsed.frontmatter,
        &parsed.body,
        &Limits::default(),
        &mut |_| true,
    )
    .map(|doc| doc.to_json())
    .map_err(|e| build_failure(&name, &parsed.body, e))
}

/// What a stored note's `body` is when it is present and neither a string nor `null`.
fn body_not_a_string(bytes: &[u8]) -> Option<&'static str> {
    let serde_json::Value::Object(note) = serde_json::from_slice(bytes).ok()? else {
        return None;
    };
    match note.get("body")? {
        serde_json::Value::Null | serde_json::Value::String(_) => None,
        serde_json::Value::Bool(_) => Some("a boolean"),
        serde_json::Value::Number(_) => Some("a number"),
        serde_json::Value::Array(_) => Some("an array"),
        serde_json::Value::Object(_) => Some("an object"),
    }
}

/// Processes a manifest TSV, writing one SectionSource JSON line per row (see
/// [`run_manifest_view`]).
pub fn run_manifest(manifest: &Path, out: &mut dyn Write) -> io::Result<bool> {
    run_manifest_view(manifest, View::SectionSource, out)
}

/// Processes a manifest TSV, writing one JSON line of `view` per row. Returns whether
/// every row was well-formed; an unreadable manifest or output is an `Err`.
pub fn run_manifest_view(manifest: &Path, view: View, out: &mut dyn Write) -> io::Result<bool> {
    let bytes = std::fs::read(manifest)?;
    let text = String::from_utf8(bytes).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "not UTF-8 (the first invalid byte is at offset {})",
                e.utf8_error().valid_up_to()
            ),
        )
    })?;
    let base = manifest.parent().unwrap_or_else(|| Path::new("."));
    let mut lines = text.lines().enumerate();
    let header = lines
        .next()
        .map(|(_, l)| l.trim_end_matches('\r'))
        .unwrap_or_default();
    let columns: Vec<&str> = header.split('\t').collect();
    let col = |name: &str| {
        columns.iter().position(|c| *c == name).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("header lacks the `{name}` column (need id, path, file)"),
            )
        })
    };
    let (id_col, path_col, file_col) = (col("id")?, col("path")?, col("file")?);

    // Lines are built in one buffer and written in large pieces; the file buffer is
    // reused from row to row.
    let mut pending = String::with_capacity(2 * OUTPUT_CHUNK);
    let mut raw = Vec::new();
    let mut all_ok = true;
    for (n, line) in lines {
        let line = line.trim_end_matches('\r');
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split('\t').collect();
        let (Some(id), Some(vault_path), Some(file)) = (
            fields.get(id_col),
            fields.get(path_col),
            fields.get(file_col),
        ) else {
            eprintln!(
                "error: manifest {} line {}: expected {} columns, found {}",
                manifest.display(),
                n + 1,
                columns.len(),
                fields.len()
            );
            all_ok = false;
            continue;
        };
        let result = build_file(vault_path, &base.join(file), view, &mut raw);
        // Ids are escaped exactly as the document is.
        pending.push_str(r#"{"id":"#);
        extract::json::push_str(&mut pending, id);
        match result {
            Ok(doc) => {
                pending.push_str(r#","ok":true,"result":"#);
                doc.write_json(&mut pending);
            }
            Err(e) => {
                pending.push_str(r#","ok":false,"error":""#);
                pending.push_str(e.class());
                pending.push('"');
            }
        }
        pending.push_str("}\n");
        if pending.len() >= OUTPUT_CHUNK {
            out.write_all(pending.as_bytes())?;
            pending.clear();
        }
    }
    out.write_all(pending.as_bytes())?;
    out.flush()?;
    Ok(all_ok)
}

/// The manifest's output is written once this much has been built.
const OUTPUT_CHUNK: usize = 64 * 1024;
