//! `tts`: text-to-speech on ggml, with backends and model families as plugins.

mod bench;
mod compare;
mod convert;
mod devices;
mod logging;
mod options;
mod pull;
mod serve;
mod soak;
mod synth;
mod voice_files;
mod voice_show;
mod voices;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use engine_core::engine::{self, Engine};
use engine_core::profile::Profile;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
// No `args_conflicts_with_subcommands`: clap counts the global -q / -v as
// arguments too, so `tts -q devices` was refused. Synthesis options given
// beside a subcommand are refused by `synthesis_args_beside_subcommand` instead.
#[command(name = "tts", about = "Text to speech on ggml; backends and model families are plugins.")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    synth: SynthArgs,
    /// Only errors on stderr.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
    /// More on stderr: -v what happens (info), -vv details (debug). `TTS_LOG` overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
}

#[derive(Args, Debug, Clone)]
struct Common {
    /// Profile (TOML). Without it the profile built into `tts` is used
    /// (`tts compare` takes two).
    #[arg(long = "profile", global = true, value_name = "FILE")]
    profiles: Vec<PathBuf>,
    /// Plugin directory (repeatable); overrides $TTS_PLUGIN_PATH and the
    /// bundle's own plugins/.
    #[arg(long = "plugin-dir", global = true, value_name = "DIR")]
    plugin_dirs: Vec<PathBuf>,
    /// Load plugins from the directories the profile's [plugins] dirs names
    /// (refused without this: a profile is data, not a source of code).
    #[arg(long = "trust-profile-plugins", global = true)]
    trust_profile_plugins: bool,
    /// Model GGUF file (repeatable); overrides the profile's [model] files.
    #[arg(long = "model", global = true, value_name = "FILE")]
    models: Vec<PathBuf>,
    /// The most device memory a model may plan to use ("6 GiB", "512MiB");
    /// overrides the profile's [backend] memory_budget. A load whose plan
    /// exceeds it (or the device's free memory) is refused; `tts fit` shows
    /// the plan.
    #[arg(long = "memory-budget", global = true, value_name = "SIZE")]
    memory_budget: Option<String>,
}

#[derive(Args, Debug)]
struct SynthArgs {
    #[command(flatten)]
    common: Common,
    /// Text to speak (`-`: read stdin). Without --text or --text-file, piped stdin is read.
    #[arg(long)]
    text: Option<String>,
    /// Read the text to speak from FILE (`-`: stdin).
    #[arg(long, value_name = "FILE", conflicts_with = "text")]
    text_file: Option<PathBuf>,
    /// Output file; `-` streams the audio to stdout as it is produced.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Audio encoding of the output; without it, --out's extension decides
    /// (.wav .pcm .raw .f32 .flac .mp3 .opus .ogg .aac; WAV for stdout).
    #[arg(long, value_enum)]
    format: Option<synth::Format>,
    #[command(flatten)]
    flags: SynthesisFlags,
    /// Override a [synthesis] option, e.g. --set steps=8 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    set: Vec<(String, String)>,
    /// Print the model's token streams on stderr after synthesis (Chatterbox:
    /// the speech tokens and the text ids), one line each; -v prints them too.
    #[arg(long)]
    print_tokens: bool,
    /// Speak with a model installed by `tts pull NAME` (its profile.toml).
    #[arg(long, value_name = "NAME", conflicts_with = "profiles")]
    model_name: Option<String>,
    /// Where `tts pull` installs models [default: $TTS_MODELS_DIR, else
    /// $XDG_DATA_HOME/tts/models, else ~/.local/share/tts/models].
    #[arg(long = "models-dir", id = "synth_models_dir", value_name = "DIR", requires = "model_name")]
    models_dir: Option<PathBuf>,
}

/// Short forms of the common [synthesis] options: each is `--set KEY=VALUE`
/// (a model family without the option refuses it by name).
#[derive(Args, Debug, Clone, Default)]
struct SynthesisFlags {
    /// Voice: a built-in name (`tts voices`) or a voice file.
    #[arg(long)]
    voice: Option<String>,
    /// Language code (`tts voices` lists the model's).
    #[arg(long)]
    language: Option<String>,
    /// Speaking rate (1 = the model's own).
    #[arg(long)]
    speed: Option<String>,
    /// Random seed.
    #[arg(long)]
    seed: Option<String>,
    /// Denoising steps (flow-matching models).
    #[arg(long)]
    steps: Option<String>,
}

impl SynthesisFlags {
    /// `set` with these flags added; a key given both ways is an error.
    fn merged(&self, set: &[(String, String)]) -> Result<Vec<(String, String)>, String> {
        let mut out = set.to_vec();
        let flags = [("voice", &self.voice), ("language", &self.language), ("speed", &self.speed), ("seed", &self.seed), ("steps", &self.steps)];
        for (key, value) in flags {
            let Some(value) = value else { continue };
            if set.iter().any(|(k, _)| k == key) {
                return Err(format!("{key} is given twice: --{key} and --set {key}=..."));
            }
            out.push((key.to_string(), value.clone()));
        }
        Ok(out)
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List plugins, devices, capability probes and resolved policies.
    Devices {
        #[command(flatten)]
        common: Common,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Whether the model fits the selected device: the memory its plugin
    /// plans for (weights, caches, each stage graph at the longest input the
    /// options allow) beside the device's free memory. Exit 1 when it does
    /// not fit; every load makes the same check.
    Fit {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        flags: SynthesisFlags,
        /// Override a [synthesis] option (repeatable); limits such as lengths
        /// change the plan.
        #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_key_value)]
        set: Vec<(String, String)>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Time repeated synthesis of one text (or cloning of one recording):
    /// per-stage medians, RTF, peak RSS.
    Bench {
        #[command(flatten)]
        common: Common,
        /// Text to speak.
        #[arg(long, required_unless_present = "reference", conflicts_with = "reference")]
        text: Option<String>,
        /// Time voice cloning of this recording instead of synthesis.
        #[arg(long, value_name = "FILE")]
        reference: Option<PathBuf>,
        /// Timed runs (the median is reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Untimed runs first (graph building, pipeline caches).
        #[arg(long, default_value_t = 1)]
        warmup: usize,
        /// Time streaming synthesis (as `--out -` and `tts serve`), with the
        /// time to the first audio, instead of one-shot synthesis.
        #[arg(long, conflicts_with = "reference")]
        stream: bool,
        #[command(flatten)]
        flags: SynthesisFlags,
        /// Override a [synthesis] option (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_key_value)]
        set: Vec<(String, String)>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run one text under two profiles (backends, devices, policies, weight
    /// files): stage times side by side, how far the outputs agree, the
    /// policies each side resolved.
    Compare {
        #[command(flatten)]
        common: Common,
        /// Text to speak.
        #[arg(long)]
        text: String,
        /// Timed runs per side after one warm-up (medians are reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Override a [synthesis] option on both sides (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_key_value)]
        set: Vec<(String, String)>,
        /// Exit 1 unless the outputs agree: `identical` (bit for bit) or `max-rel=X`.
        #[arg(long, value_name = "WHAT")]
        expect: Option<String>,
        /// Also write the report as JSON here.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        /// Also draw both waveforms, their difference and the stage times (PNG).
        #[arg(long, value_name = "FILE.png")]
        plot: Option<PathBuf>,
    },
    /// Synthesize one text many times in one process: every output must equal
    /// the first bit for bit, and resident memory must not grow after warm-up.
    Soak {
        #[command(flatten)]
        common: Common,
        /// Text to speak.
        #[arg(long)]
        text: String,
        /// Syntheses in all.
        #[arg(long, default_value_t = 200)]
        runs: usize,
        /// Runs before the memory baseline is taken.
        #[arg(long, default_value_t = 10)]
        warmup: usize,
        /// Largest resident-memory growth after warm-up, MiB.
        #[arg(long, default_value_t = 10.0)]
        max_rss_growth_mib: f64,
        /// Override a [synthesis] option (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_key_value)]
        set: Vec<(String, String)>,
        /// Print JSON instead of a line.
        #[arg(long)]
        json: bool,
    },
    /// Saved voices: `tts voice save --reference REC --out NAME.voice`;
    /// `tts voice show NAME.voice` prints what one holds.
    Voice {
        #[command(subcommand)]
        action: VoiceCommand,
    },
    /// The loaded model's built-in voices and languages, and the voice files
    /// in a directory.
    Voices {
        #[command(flatten)]
        common: Common,
        /// Also list the voice files here the model can use (Chatterbox:
        /// NAME.voice saved by the same variant; Supertonic: NAME.json styles).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Every option of the profile's model family ([synthesis], --set) and
    /// backends ([backends.NAME]): kind, default and help.
    Options {
        #[command(flatten)]
        common: Common,
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Serve the OpenAI speech API (`POST /v1/audio/speech`) with the models
    /// loaded once; each --profile is one model, named by its file's stem.
    Serve {
        #[command(flatten)]
        common: Common,
        /// Address to listen on (127.0.0.1: this machine only).
        #[arg(long, default_value = "127.0.0.1")]
        host: std::net::IpAddr,
        /// Port (0: any free one; the address is printed).
        #[arg(long, default_value_t = 8880)]
        port: u16,
        /// Sessions per model, each on its own thread (each loads the model).
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// Requests that may wait for a worker per model; more get 429.
        #[arg(long, default_value_t = 16)]
        queue: usize,
        /// Require `Authorization: Bearer KEY` on /v1/ (default: $TTS_API_KEY).
        #[arg(long, value_name = "KEY")]
        api_key: Option<String>,
        /// Voice files requests may name (NAME.voice, NAME.json), by NAME.
        #[arg(long, value_name = "DIR")]
        voices_dir: Option<PathBuf>,
        /// Longest input, in characters (longer: 413).
        #[arg(long, default_value_t = 4096)]
        max_input_chars: usize,
        /// Seconds a connection may take to send a request's head, from its
        /// first byte (a new connection's first head: from the opening).
        #[arg(long, value_name = "SECONDS", default_value_t = 10.0, value_parser = parse_seconds)]
        header_timeout: f64,
        /// Seconds a kept-alive connection may wait between a response and
        /// the next request.
        #[arg(long, value_name = "SECONDS", default_value_t = 30.0, value_parser = parse_seconds)]
        idle_timeout: f64,
        /// Seconds a speech request's body may take to arrive (longer: 408).
        #[arg(long, value_name = "SECONDS", default_value_t = 30.0, value_parser = parse_seconds)]
        body_timeout: f64,
        /// Seconds a response may wait for the client to take its next piece
        /// of audio; past it the synthesis is cancelled and the connection
        /// closed, freeing the worker for others.
        #[arg(long, value_name = "SECONDS", default_value_t = 30.0, value_parser = parse_seconds)]
        send_timeout: f64,
        /// Connections open at once; more are answered 503 and closed
        /// [default: 4096, or what the hard open-file limit leaves].
        #[arg(long, value_name = "N")]
        max_connections: Option<usize>,
        /// Seconds a drain (SIGTERM, Ctrl-C) waits for open connections
        /// before it closes them and exits.
        #[arg(long, value_name = "SECONDS", default_value_t = 20.0, value_parser = parse_seconds)]
        shutdown_grace: f64,
        /// Override a [synthesis] option of every model (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_key_value)]
        set: Vec<(String, String)>,
        /// A web origin browsers may call the API from (CORS), e.g.
        /// `https://app.example` (repeatable); `*`: any origin, refused with
        /// an API key unless --cors-allow-any-with-key.
        #[arg(long = "cors-origin", value_name = "ORIGIN")]
        cors_origins: Vec<String>,
        /// Allow `--cors-origin '*'` with an API key: any web page may then
        /// send requests, with a key its user gives it.
        #[arg(long)]
        cors_allow_any_with_key: bool,
        /// Refuse to start without an API key (from $TTS_API_KEY or
        /// --api-key): for deployments where serving unauthenticated would
        /// be a misconfiguration, such as the container image.
        #[arg(long)]
        require_api_key: bool,
        /// Serve a model installed by `tts pull NAME`, with id NAME
        /// (repeatable; with --profile too, each is one more model).
        #[arg(long = "model-name", value_name = "NAME")]
        model_names: Vec<String>,
        /// Where `tts pull` installs models [default: $TTS_MODELS_DIR, else
        /// $XDG_DATA_HOME/tts/models, else ~/.local/share/tts/models].
        #[arg(long = "models-dir", id = "serve_models_dir", value_name = "DIR", requires = "model_names")]
        models_dir: Option<PathBuf>,
        /// Before serving, `tts pull` each --model-name not installed yet
        /// (a catalog name; default storage).
        #[arg(long, requires = "model_names")]
        pull: bool,
    },
    /// Ask a running `tts serve` whether it is ready: exit 0 when its
    /// `/health` answers 200, else 1 with the reason (a container's
    /// HEALTHCHECK; the image has no curl).
    Health {
        /// The server's base URL.
        #[arg(long, default_value = "http://127.0.0.1:8880")]
        url: String,
        /// Seconds to wait for the connection and the answer.
        #[arg(long, value_name = "SECONDS", default_value_t = 5.0, value_parser = parse_seconds)]
        timeout: f64,
    },
    /// Convert an official checkpoint directory to the GGUF files `tts`
    /// loads, with the converter of the model plugin that recognises it
    /// (`--list`: the converters, their marker files and options).
    Convert {
        #[command(flatten)]
        common: Common,
        /// The checkpoint directory as published (e.g. a Hugging Face snapshot).
        #[arg(required_unless_present = "list")]
        source: Option<PathBuf>,
        /// Where the GGUF files go (created if missing).
        #[arg(required_unless_present = "list")]
        out_dir: Option<PathBuf>,
        /// The model family whose converter to use (default: the one that
        /// recognises SOURCE's files).
        #[arg(long)]
        family: Option<String>,
        /// Storage of the large matrices: f32, f16, bf16, q8_0, q4_0 (what
        /// the family offers; short for --set weights=...).
        #[arg(long)]
        weights: Option<String>,
        /// A converter option, e.g. --set variant=nano (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_key_value)]
        set: Vec<(String, String)>,
        /// List the converters instead.
        #[arg(long)]
        list: bool,
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Download a model's official files from the Hugging Face Hub, convert
    /// them and install the GGUFs with a profile (`tts models` lists them;
    /// `tts --model-name NAME --text ... --out ...` speaks with one).
    Pull {
        #[command(flatten)]
        common: Common,
        /// A catalog name (an unknown one lists the catalog), optionally
        /// NAME@REVISION (a branch, tag or commit of its repository).
        name: String,
        /// Storage of the large matrices (what the family offers).
        #[arg(long, value_parser = ["f32", "f16", "q8_0", "q4_0"])]
        weights: Option<String>,
        /// Where models are installed [default: $TTS_MODELS_DIR, else
        /// $XDG_DATA_HOME/tts/models, else ~/.local/share/tts/models].
        #[arg(long, value_name = "DIR")]
        models_dir: Option<PathBuf>,
        /// A converter option, e.g. --set decoder_weights=bf16 (repeatable;
        /// `tts convert --list` lists them).
        #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_key_value)]
        set: Vec<(String, String)>,
    },
    /// The models `tts pull` installed: name, family, variant, storage, size,
    /// path; `tts models rm NAME` removes one.
    Models {
        #[command(subcommand)]
        action: Option<ModelsCommand>,
        /// Where models are installed (as for `tts pull`).
        #[arg(long, value_name = "DIR", global = true)]
        models_dir: Option<PathBuf>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script: `tts completions bash > /etc/bash_completion.d/tts`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Subcommand, Debug)]
enum ModelsCommand {
    /// Remove an installed model.
    Rm {
        /// Its name, as `tts models` lists it.
        name: String,
    },
}

#[derive(Subcommand, Debug)]
enum VoiceCommand {
    /// Clone the voice of a recording once and save it as a voice file;
    /// `--set voice=FILE` then synthesizes with it without the encoders.
    Save {
        #[command(flatten)]
        common: Common,
        /// The recording to clone (WAV, FLAC, MP3 or Ogg Vorbis).
        #[arg(long, value_name = "FILE")]
        reference: PathBuf,
        /// The voice file to write (e.g. NAME.voice).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// Override a [synthesis] option (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_key_value)]
        set: Vec<(String, String)>,
    },
    /// What a voice file holds: a Chatterbox voice's variant, tensors (shape,
    /// type, value statistics) and token ids; a Supertonic voice style's
    /// arrays. Reads the file alone (no profile, no model).
    Show {
        /// The voice file (NAME.voice, or a voice style NAME.json).
        file: PathBuf,
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    let (k, v) = s.split_once('=').ok_or_else(|| format!("`{s}` is not KEY=VALUE"))?;
    if k.trim().is_empty() {
        return Err(format!("`{s}` has an empty key"));
    }
    Ok((k.trim().to_string(), v.to_string()))
}

/// A duration in seconds for the server's timeouts: finite, positive, and
/// at most a day (a larger one is no limit at all).
fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !(v.is_finite() && v > 0.0 && v <= 86_400.0) {
        return Err(format!("`{s}` seconds: must be more than 0 and at most 86400"));
    }
    Ok(v)
}

fn version_line() -> String {
    format!("{} (plugin ABI {}, ggml {} from {})", env!("CARGO_PKG_VERSION"), engine_core::PLUGIN_ABI_VERSION, ggml_sys::GGML_VERSION, ggml_sys::SOURCE_PACKAGE)
}

/// `TTS_LOG` from -q / -v unless the environment sets it; set before any
/// plugin loads, since each plugin reads it for its own log output.
fn set_verbosity(quiet: bool, verbose: u8) {
    if std::env::var_os("TTS_LOG").is_some() {
        return;
    }
    let filter = match (quiet, verbose) {
        (true, _) => Some("error,ggml=off,symphonia=off"),
        (false, 0) => None,
        (false, 1) => Some("info,ggml=off,symphonia=off"),
        (false, _) => Some("debug,symphonia=off"),
    };
    if let Some(f) = filter {
        std::env::set_var("TTS_LOG", f);
    }
}

/// A top-level synthesis option (`--text`, `--out`, ...) given with a
/// subcommand, which would ignore it: named so the user learns it did nothing.
/// Global options (-q, -v, --profile, ...) belong to every subcommand.
fn synthesis_args_beside_subcommand(matches: &clap::ArgMatches) -> Option<String> {
    let (name, _) = matches.subcommand()?;
    let command = Cli::command();
    let given: Vec<String> = command
        .get_arguments()
        .filter(|a| !a.is_global_set() && matches.value_source(a.get_id().as_str()) == Some(clap::parser::ValueSource::CommandLine))
        .map(|a| a.get_long().map_or_else(|| a.get_id().to_string(), |l| format!("--{l}")))
        .collect();
    (!given.is_empty()).then(|| format!("{} given before `{name}`: synthesis options apply only without a subcommand", given.join(", ")))
}

fn main() -> ExitCode {
    // A bug must still end as one line and leave no temporary behind: the hook
    // prints the one line, unwinding drops (and so deletes) any temporary.
    std::panic::set_hook(Box::new(|info| {
        let message =
            info.payload().downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| info.payload().downcast_ref::<String>().cloned()).unwrap_or_default();
        let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        eprintln!("error: internal error (a bug in tts): {}{at}", engine_core::logging::escape(&message.replace('\n', " ")));
    }));
    let version: &'static str = Box::leak(version_line().into_boxed_str());
    let matches = Cli::command().version(version).get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    if let Some(e) = synthesis_args_beside_subcommand(&matches) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    set_verbosity(cli.quiet, cli.verbose);
    logging::init();
    // The server drains on SIGTERM itself (and writes no files).
    if !matches!(cli.command, Some(Command::Serve { .. })) {
        if let Err(e) = engine_core::output::remove_temporaries_on_signals() {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }
    match std::panic::catch_unwind(|| run(cli)) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            // Errors quote user text (paths, option values, characters of the
            // text): escaped as the log lines are.
            eprintln!("error: {}", engine_core::logging::escape(&e.replace('\n', " ")));
            ExitCode::FAILURE
        }
        Err(_) => ExitCode::FAILURE,
    }
}

/// A profile's `[server.voices]`, each key one of OpenAI's voice names.
fn openai_voices_of(profile: &Profile) -> Result<Vec<(String, String)>, String> {
    let voices = profile.server_voices();
    if let Some((name, _)) = voices.iter().find(|(name, _)| !tts_serve_api::OPENAI_VOICES.contains(&name.as_str())) {
        let message = format!("[server.voices]: `{name}` is not an OpenAI voice name (known: {})", tts_serve_api::OPENAI_VOICES.join(", "));
        return Err(profile.server_voice_error(name, message).to_string());
    }
    Ok(voices)
}

/// `tts pull SPEC` into the models directory, converting with the plugin
/// that recognises the checkpoint; the installed model's directory.
fn pull_model(
    common: &Common,
    spec: &str,
    weights: Option<&str>,
    set: &[(String, String)],
    models_dir: Option<&std::path::Path>,
    quiet: bool,
) -> Result<PathBuf, String> {
    let convert = |source: &std::path::Path, out: &std::path::Path, family: Option<&str>, options: &[(String, String)]| {
        let report = convert::convert_checkpoint(common, source, out, family, options)?;
        Ok((report.variant, report.files.into_iter().map(|f| (f.path, f.summary)).collect()))
    };
    let request = pull::PullRequest { spec, weights, set, models_dir, quiet };
    pull::pull(&request, &convert)
}

/// `--cors-origin`: exact origins (`scheme://host[:port]`, as browsers send
/// them), or `*`, which with an API key needs `--cors-allow-any-with-key`.
fn cors_of(origins: Vec<String>, any_with_key: bool, api_key: bool) -> Result<serve::Cors, String> {
    let any = origins.iter().any(|o| o == "*");
    if any && api_key && !any_with_key {
        return Err("--cors-origin '*' with an API key lets any web page use the server with a key its user gives it; pass --cors-allow-any-with-key to allow that, or name the origins".into());
    }
    for o in origins.iter().filter(|o| *o != "*") {
        let well_formed = o.split_once("://").is_some_and(|(scheme, host)| !scheme.is_empty() && !host.is_empty() && !host.contains('/')) && o.is_ascii();
        if !well_formed {
            return Err(format!("--cors-origin {o}: not an origin (scheme://host[:port], e.g. https://app.example, or *)"));
        }
    }
    Ok(serve::Cors { origins: origins.into_iter().filter(|o| o != "*").collect(), any })
}

/// Opens the engine for `common`'s profile; `everything` also opens backends the
/// profile does not prefer and checks model plugins (for `tts devices`).
fn open_engine(common: &Common, everything: bool) -> Result<Engine, String> {
    let profile = match common.profiles.as_slice() {
        [] => None,
        [one] => Some(one.as_path()),
        more => return Err(format!("--profile is given {} times; only `tts compare` takes two", more.len())),
    };
    open_engine_with(common, profile, everything)
}

/// Opens the engine for `profile` (None: the embedded default) with `common`'s
/// plugin directories and model files.
fn open_engine_with(common: &Common, profile: Option<&std::path::Path>, everything: bool) -> Result<Engine, String> {
    let mut profile = match profile {
        Some(p) => Profile::load(p).map_err(|e| e.to_string())?,
        None => Profile::embedded_default(),
    };
    if !common.models.is_empty() {
        profile.model_files = common.models.clone();
    }
    if let Some(budget) = &common.memory_budget {
        profile.memory_budget = Some(engine_core::profile::parse_size(budget).map_err(|e| format!("--memory-budget: {e}"))?);
    }
    let exe = std::env::current_exe().ok();
    let dirs = engine::plugin_dirs(&profile, exe.as_deref(), &common.plugin_dirs, common.trust_profile_plugins).map_err(|e| e.to_string())?;
    let opened = if everything { Engine::open_all(profile, dirs) } else { Engine::open(profile, dirs) };
    opened.map_err(|e| e.to_string())
}

/// `tts fit --json`: the report's fields, sizes in bytes.
fn fit_json(report: &engine::FitReport) -> serde_json::Value {
    let plan = report.plan.as_ref().map(|p| {
        serde_json::json!({
            "sized_for": p.sized_for.as_str(),
            "items": p.items.iter().map(|i| serde_json::json!({"what": i.what.as_str(), "bytes": i.bytes})).collect::<Vec<_>>(),
            "total": p.total(),
        })
    });
    serde_json::json!({
        "family": report.family,
        "backend": report.backend,
        "device": report.device,
        "free": report.free,
        "total": report.total,
        "memory_budget": report.configured_budget,
        "budget": report.budget(),
        "plan": plan,
        "fits": report.fits(),
    })
}

/// The profiles named on the command line, as inputs an output must not replace.
fn input_profiles(common: &Common) -> Vec<(String, PathBuf)> {
    common.profiles.iter().map(|p| ("profile".to_string(), p.clone())).collect()
}

/// Writes to stdout; a reader that went away (`| head`) is not an error.
fn write_stdout(text: &str) -> Result<(), String> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("writing to stdout: {e}")),
        _ => Ok(()),
    }
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Some(Command::Devices { common, json }) => {
            let engine = open_engine(&common, true)?;
            let report = engine.devices_report();
            let text = if json { serde_json::to_string_pretty(&report).map_err(|e| e.to_string())? + "\n" } else { devices::render(&report) };
            write_stdout(&text)
        }
        Some(Command::Fit { common, flags, set, json }) => {
            let set = flags.merged(&set)?;
            let engine = open_engine(&common, false)?;
            let report = engine.fit(&set).map_err(|e| e.to_string())?;
            let text =
                if json { serde_json::to_string_pretty(&fit_json(&report)).map_err(|e| e.to_string())? + "\n" } else { report.lines().join("\n") + "\n" };
            write_stdout(&text)?;
            match report.fits() {
                Some(false) => Err(report.summary()),
                _ => Ok(()),
            }
        }
        Some(Command::Bench { common, text, reference, runs, warmup, stream, flags, set, json }) => {
            let set = flags.merged(&set)?;
            let engine = open_engine(&common, false)?;
            let start = std::time::Instant::now();
            let mut session = engine.open_model(&set).map_err(|e| e.to_string())?;
            let load_ms = start.elapsed().as_secs_f64() * 1e3;
            let work = match (&text, &reference) {
                (_, Some(r)) => bench::Work::CloneVoice(r),
                (Some(t), None) if stream => bench::Work::Stream(t),
                (Some(t), None) => bench::Work::Synthesize(t),
                (None, None) => return Err("give --text or --reference".into()),
            };
            let report = bench::run(&mut session, work, runs, warmup, load_ms)?;
            let text = if json { serde_json::to_string_pretty(&report).map_err(|e| e.to_string())? + "\n" } else { bench::render(&report) };
            write_stdout(&text)
        }
        Some(Command::Compare { common, text, runs, set, expect, json, plot }) => {
            let [a, b] = common.profiles.as_slice() else {
                return Err(format!("tts compare takes two --profile files; {} given", common.profiles.len()));
            };
            // Everything that can be wrong with the arguments is found before any synthesis.
            let expect = expect.as_deref().map(compare::Expect::parse).transpose()?;
            if runs == 0 {
                return Err("--runs must be at least 1".into());
            }
            for (flag, path) in [("--json", &json), ("--plot", &plot)] {
                if let Some(p) = path {
                    compare::check_output_dir(flag, p)?;
                }
            }
            let mut sides = Vec::new();
            for profile in [a, b] {
                let engine = open_engine_with(&common, Some(profile), false)?;
                let mut session = engine.open_model(&set).map_err(|e| format!("{}: {e}", profile.display()))?;
                for (flag, path) in [("--json", &json), ("--plot", &plot)] {
                    if let Some(p) = path {
                        session.refuse_input_as_output(p, &input_profiles(&common)).map_err(|e| format!("{flag} {e}"))?;
                    }
                }
                if let Some(first) = sides.first() {
                    let first: &compare::Side = first;
                    if first.session.family != session.info.family.as_str() {
                        return Err(format!(
                            "the profiles load different model families: {} runs {}, {} runs {}",
                            first.profile,
                            first.session.family,
                            profile.display(),
                            session.info.family
                        ));
                    }
                }
                sides.push(compare::run_side(profile, &mut session, &text, runs)?);
            }
            let b_side = sides.pop().expect("two sides");
            let a_side = sides.pop().expect("two sides");
            let report = compare::report(&text, runs, a_side, b_side);
            write_stdout(&compare::render(&report))?;
            if let Some(path) = &json {
                let body = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())? + "\n";
                engine_core::output::write_file(path, body.as_bytes()).map_err(|e| format!("--json {}: {e}", path.display()))?;
            }
            if let Some(path) = &plot {
                compare::plot(&report, path)?;
            }
            compare::verdict(&report, expect)
        }
        Some(Command::Soak { common, text, runs, warmup, max_rss_growth_mib, set, json }) => {
            soak::check_limit(max_rss_growth_mib)?;
            let engine = open_engine(&common, false)?;
            let mut session = engine.open_model(&set).map_err(|e| e.to_string())?;
            let report = soak::run(&mut session, &text, runs, warmup)?;
            let out = if json { serde_json::to_string_pretty(&report).map_err(|e| e.to_string())? + "\n" } else { soak::render(&report) };
            write_stdout(&out)?;
            soak::verdict(&report, max_rss_growth_mib)
        }
        Some(Command::Voice { action: VoiceCommand::Save { common, reference, out, set } }) => {
            let engine = open_engine(&common, false)?;
            // Only what cloning reads (ABI 5.3), where the plugin can: a
            // fraction of the full model's memory and load time.
            let mut session = engine.open_model_for_cloning(&set).map_err(|e| e.to_string())?;
            session.refuse_input_as_output(&out, &input_profiles(&common)).map_err(|e| e.to_string())?;
            let timings = session.save_voice(&reference, &out).map_err(|e| e.to_string())?;
            let total: f64 = timings.iter().map(|(_, ms)| ms).sum();
            let stages: Vec<String> = timings.iter().map(|(stage, ms)| format!("{stage} {ms:.0} ms")).collect();
            if !cli.quiet {
                let shown = out.display().to_string();
                let shown = engine_core::logging::escape(&shown);
                eprintln!("wrote {shown} ({} {}; {total:.0} ms: {})", session.info.family, session.info.variant, stages.join(", "));
            }
            Ok(())
        }
        Some(Command::Voice { action: VoiceCommand::Show { file, json } }) => {
            let summary = voice_show::read(&file)?;
            let text = if json { serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())? + "\n" } else { voice_show::render(&summary) };
            write_stdout(&text)
        }
        Some(Command::Voices { common, dir, json }) => {
            let engine = open_engine(&common, false)?;
            let session = engine.open_model(&[]).map_err(|e| e.to_string())?;
            let report = voices::report(&session, dir.as_deref())?;
            let text = if json { serde_json::to_string_pretty(&report).map_err(|e| e.to_string())? + "\n" } else { voices::render(&report) };
            write_stdout(&text)
        }
        Some(Command::Options { common, json }) => {
            let report = open_engine(&common, false)?.options_report().map_err(|e| e.to_string())?;
            let text = if json { serde_json::to_string_pretty(&report).map_err(|e| e.to_string())? + "\n" } else { options::render(&report) };
            write_stdout(&text)
        }
        Some(Command::Serve {
            common,
            host,
            port,
            workers,
            queue,
            api_key,
            voices_dir,
            max_input_chars,
            header_timeout,
            idle_timeout,
            body_timeout,
            send_timeout,
            max_connections,
            shutdown_grace,
            set,
            cors_origins,
            cors_allow_any_with_key,
            require_api_key,
            model_names,
            models_dir,
            pull,
        }) => {
            if common.profiles.len() + model_names.len() > 1 && !common.models.is_empty() {
                return Err("--model applies to one profile; with several, name each model file in its profile".into());
            }
            if workers == 0 || queue == 0 {
                return Err("--workers and --queue must be at least 1".into());
            }
            if max_connections == Some(0) {
                return Err("--max-connections must be at least 1".into());
            }
            // `--api-key "$KEY"` with KEY unset, or TTS_API_KEY set empty,
            // would otherwise serve with no authentication at all.
            let api_key = match (api_key, std::env::var_os("TTS_API_KEY")) {
                (Some(k), _) if k.is_empty() => return Err("--api-key is empty (is the variable it names unset?); omit it to serve without a key".into()),
                (Some(k), _) => Some(k),
                (None, Some(k)) if k.is_empty() => return Err("TTS_API_KEY is set but empty; unset it to serve without a key".into()),
                (None, Some(k)) => Some(k.into_string().map_err(|_| "TTS_API_KEY is not valid UTF-8".to_string())?),
                (None, None) => None,
            };
            if require_api_key && api_key.is_none() {
                return Err("no API key, and --require-api-key is given: set TTS_API_KEY (or --api-key)".into());
            }
            if let Some(dir) = voices_dir.as_deref().filter(|d| !d.is_dir()) {
                return Err(format!("--voices-dir {}: not a directory", dir.display()));
            }
            let cors = cors_of(cors_origins, cors_allow_any_with_key, api_key.is_some())?;
            // (profile, model id): each --profile by its file's stem, each
            // --model-name by its name, else the built-in profile.
            let mut profiles: Vec<(Option<PathBuf>, String)> = Vec::new();
            for p in &common.profiles {
                profiles.push((Some(p.clone()), p.file_stem().map_or(String::new(), |s| s.to_string_lossy().into_owned())));
            }
            for name in &model_names {
                let installed = match pull::installed_profile(models_dir.as_deref(), name) {
                    Err(_) if pull => {
                        pull_model(&common, name, None, &[], models_dir.as_deref(), cli.quiet)?;
                        pull::installed_profile(models_dir.as_deref(), name)?
                    }
                    found => found?,
                };
                profiles.push((Some(installed), name.clone()));
            }
            if profiles.is_empty() {
                profiles.push((None, "default".to_string()));
            }
            for (i, (_, id)) in profiles.iter().enumerate() {
                if profiles[..i].iter().any(|(_, other)| other == id) {
                    return Err(format!("two models are named `{id}`; a model is named by its profile file's stem or its --model-name"));
                }
            }
            let mut sources: Vec<serve::ModelSource> = Vec::new();
            for (profile, id) in profiles {
                let profile = profile.as_deref();
                let openai_voices = match profile {
                    Some(p) => openai_voices_of(&Profile::load(p).map_err(|e| e.to_string())?)?,
                    None => Vec::new(),
                };
                sources.push(serve::ModelSource { engine: open_engine_with(&common, profile, false)?, id, openai_voices });
            }
            let limits = serve::Limits {
                header_timeout: std::time::Duration::from_secs_f64(header_timeout),
                idle_timeout: std::time::Duration::from_secs_f64(idle_timeout),
                body_timeout: std::time::Duration::from_secs_f64(body_timeout),
                send_timeout: std::time::Duration::from_secs_f64(send_timeout),
                max_connections: max_connections.unwrap_or(tts_serve_api::DEFAULT_MAX_CONNECTIONS),
                shutdown_grace: std::time::Duration::from_secs_f64(shutdown_grace),
            };
            let options = serve::ServeOptions {
                listen: std::net::SocketAddr::new(host, port),
                workers,
                queue,
                api_key,
                voices_dir,
                max_input_chars,
                set,
                max_connections_default: max_connections.is_none(),
                cors,
                limits,
            };
            serve::run(sources, options, cli.quiet)
        }
        Some(Command::Health { url, timeout }) => serve::probe_health(&url, std::time::Duration::from_secs_f64(timeout)),
        Some(Command::Convert { common, source, out_dir, family, weights, set, list, json }) => {
            if list {
                return write_stdout(&convert::list(&common, json)?);
            }
            let (Some(source), Some(out_dir)) = (source, out_dir) else {
                return Err("give SOURCE and OUT_DIR, or --list".into());
            };
            let mut set = set;
            if let Some(w) = weights {
                if set.iter().any(|(k, _)| k == "weights") {
                    return Err("weights is given twice: --weights and --set weights=...".into());
                }
                set.push(("weights".into(), w));
            }
            let text = convert::run(&common, &source, &out_dir, family.as_deref(), &set, cli.quiet, json)?;
            if cli.quiet && !json {
                return Ok(());
            }
            write_stdout(&text)
        }
        Some(Command::Pull { common, name, weights, models_dir, set }) => {
            if weights.is_some() && set.iter().any(|(k, _)| k == "weights") {
                return Err("weights is given twice: --weights and --set weights=...".into());
            }
            if !common.models.is_empty() {
                return Err("--model does not apply to `tts pull` (it installs the model files it converts)".into());
            }
            let dir = pull_model(&common, &name, weights.as_deref(), &set, models_dir.as_deref(), cli.quiet)?;
            if !cli.quiet {
                let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                eprintln!(
                    "installed {} (speak with: tts --model-name {name} --text \"Hello.\" --out hello.wav)",
                    engine_core::logging::escape(&dir.display().to_string())
                );
            }
            Ok(())
        }
        Some(Command::Models { action, models_dir, json }) => {
            let models = pull::models_dir(models_dir.as_deref())?;
            match action {
                Some(ModelsCommand::Rm { name }) => {
                    let dir = pull::remove(&models, &name)?;
                    if !cli.quiet {
                        eprintln!("removed {}", engine_core::logging::escape(&dir.display().to_string()));
                    }
                    Ok(())
                }
                None => {
                    let installed = pull::list(&models)?;
                    let text =
                        if json { serde_json::to_string_pretty(&installed).map_err(|e| e.to_string())? + "\n" } else { pull::render(&models, &installed) };
                    write_stdout(&text)
                }
            }
        }
        Some(Command::Completions { shell }) => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "tts", &mut script);
            write_stdout(&String::from_utf8_lossy(&script))
        }
        None => {
            let args = cli.synth;
            let Some(out) = args.out.as_deref() else {
                return Err("give --out FILE (or --out - for stdout) to synthesize, or a subcommand (see --help)".into());
            };
            let format = synth::Format::for_output(out, args.format)?;
            let set = args.flags.merged(&args.set)?;
            let text = synth::read_text(args.text.as_deref(), args.text_file.as_deref())?;
            if text.trim().is_empty() {
                return Err("text is empty".into());
            }
            let mut common = args.common.clone();
            if let Some(name) = &args.model_name {
                common.profiles = vec![pull::installed_profile(args.models_dir.as_deref(), name)?];
            }
            let engine = open_engine(&common, false)?;
            let mut session = engine.open_model(&set).map_err(|e| e.to_string())?;
            if out != std::path::Path::new("-") {
                let mut extra = input_profiles(&args.common);
                extra.extend(args.text_file.iter().filter(|p| p.as_os_str() != "-").map(|p| ("text file".to_string(), p.clone())));
                session.refuse_input_as_output(out, &extra).map_err(|e| e.to_string())?;
            }
            let written = synth::synthesize(&mut session, &text, out, format, &synth::Progress::new(cli.quiet))?;
            // On stderr: stdout may be the audio.
            if args.print_tokens || (cli.verbose > 0 && !cli.quiet) {
                eprint!("{}", synth::token_lines(session.info.family.as_str(), &written.tokens));
            }
            if !cli.quiet && out != std::path::Path::new("-") {
                eprintln!("wrote {} ({:.2} s at {} Hz)", engine_core::logging::escape(&out.display().to_string()), written.seconds, written.sample_rate);
            }
            if written.reader_gone {
                tracing::info!("stdout was closed after {:.2} s of audio; synthesis stopped there", written.seconds);
            }
            Ok(())
        }
    }
}
