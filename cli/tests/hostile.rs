//! Hostile but fair input, each defect of the probe that found them as a test
//! (docs/reliability.md has the matrix): output files that links cannot
//! redirect, libraries never loaded from the working directory, model files
//! whose every value is checked, bounded thread counts, errors that name the
//! real cause. Every failure must be exit 1, one line on stderr naming the
//! problem, no output or temporary file, no signal.

mod common;

use common::*;
use ggml_sys::gguf::GgufEditor;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;

fn args<'a>(profile: &'a Path, plugins: &'a Path, text: &'a str, out: &'a Path) -> Vec<&'a str> {
    vec!["--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.to_str().unwrap(), "--text", text, "--out", out.to_str().unwrap()]
}

/// Asserts the error contract and that `dir` holds only `expected` names afterwards.
fn assert_refused(o: &Output, want: &str, dir: &Path, expected: &[&str]) {
    assert_one_line_error(o, want);
    assert_eq!(dir_names(dir), expected, "after `{want}`: no output or temporary left");
}

fn is_wav(path: &Path) -> bool {
    hound::WavReader::open(path).is_ok()
}

const CAP_CHOWN: u32 = 0;
const CAP_MKNOD: u32 = 27;

/// Whether this process holds capability `bit` (Linux numbering) in its
/// effective set: root normally does, root in a restricted container may not.
fn has_capability(bit: u32) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let effective = status.lines().find_map(|l| l.strip_prefix("CapEff:")).and_then(|v| u64::from_str_radix(v.trim(), 16).ok());
    effective.is_some_and(|caps| caps >> bit & 1 == 1)
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
}

// 1. Output files.

#[test]
fn planted_temporary_link_redirects_nothing() {
    // The reproduction: a link at the old fixed temporary name.
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &[supertonic_fixture()]);
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let victim = work.join("victim.txt");
    std::fs::write(&victim, "precious\n").unwrap();
    symlink("victim.txt", work.join(".o.wav.partial")).unwrap();
    let out = work.join("o.wav");
    let o = run(&args(&profile, plugins.path(), "Hello.", &out));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    assert!(is_wav(&out));
    assert_eq!(dir_names(&work), [".o.wav.partial", "o.wav", "victim.txt"]);
}

#[test]
fn link_at_the_output_is_replaced_not_followed() {
    let (plugins, gguf) = tone_setup(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &[gguf]);
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, "precious\n").unwrap();
    let link = dir.path().join("o.wav");
    symlink(&victim, &link).unwrap();
    let o = run(&args(&profile, plugins.path(), "hi", &link));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    assert!(!std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert!(is_wav(&link));
}

/// A FIFO (what `/dev/null` or `/dev/stdout` stand for) is written in place and
/// stays a FIFO, directly and through a link.
#[test]
fn fifo_output_is_written_in_place() {
    use std::os::unix::fs::FileTypeExt;
    let (plugins, gguf) = tone_setup(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &[gguf]);
    let fifo = dir.path().join("pipe.wav");
    mkfifo(&fifo);
    let link = dir.path().join("link.wav");
    symlink(&fifo, &link).unwrap();
    for target in [&fifo, &link] {
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read(fifo).unwrap())
        };
        let o = run(&args(&profile, plugins.path(), "hi", target));
        if !o.status.success() {
            // Release the waiting reader before failing.
            use std::os::unix::fs::OpenOptionsExt;
            let _ = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&fifo);
            let _ = reader.join();
            panic!("{}", stderr(&o));
        }
        let bytes = reader.join().unwrap();
        // A FIFO cannot seek: the WAV is streamed with the header of unknown
        // length (`--out -` writes the same), then every sample.
        assert_eq!(&bytes[..4], b"RIFF");
        assert_eq!(&bytes[36..44], b"data\xff\xff\xff\xff");
        assert_eq!(bytes.len(), 44 + 2 * 2 * 1600, "0.1 s per character at 16 kHz");
        assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO is kept");
    }
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(dir_names(dir.path()), ["link.wav", "pipe.wav", "profile.toml"]);
}

#[test]
fn replaced_output_keeps_its_mode() {
    let (plugins, gguf) = tone_setup(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &[gguf]);
    let out = dir.path().join("o.wav");
    std::fs::write(&out, "old").unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = run(&args(&profile, plugins.path(), "hi", &out));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(is_wav(&out));
    assert_eq!(std::fs::metadata(&out).unwrap().permissions().mode() & 0o777, 0o600);
}

/// Four runs writing the same output at once, each holding its finished
/// temporary for a while so that all four overlap: every run succeeds and the
/// file is one run's whole output.
#[test]
fn concurrent_runs_leave_one_whole_output() {
    let (plugins, gguf) = tone_setup(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &[gguf]);
    let out = dir.path().join("o.wav");
    let texts = ["a", "bb", "ccc", "dddd"];
    let children: Vec<_> = texts
        .iter()
        .map(|text| {
            std::process::Command::new(tts())
                .args(args(&profile, plugins.path(), text, &out))
                .env(engine_core::output::TEST_FAULT_ENV, "pause:400")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let o = wait_or_kill(child, std::time::Duration::from_secs(120), "concurrent tts");
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let samples = hound::WavReader::open(&out).unwrap().len() as usize;
    assert!(texts.iter().any(|t| t.len() * 1600 == samples), "{samples} samples is no run's output");
    assert_eq!(dir_names(dir.path()), ["o.wav", "profile.toml"]);
}

/// SIGINT and SIGTERM while the temporary exists: it is removed, no output
/// appears, and the exit status says which signal ended the run.
#[test]
fn interrupted_runs_remove_their_temporary() {
    let (plugins, gguf) = tone_setup(&["cpu"]);
    for (signal, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        let dir = tempfile::tempdir().unwrap();
        let profile = profile_on(dir.path(), "cpu", std::slice::from_ref(&gguf));
        let out = dir.path().join("o.wav");
        let child = std::process::Command::new(tts())
            .args(args(&profile, plugins.path(), "hi", &out))
            .env(engine_core::output::TEST_FAULT_ENV, "pause:60000")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let start = std::time::Instant::now();
        while !dir_names(dir.path()).iter().any(|n| n.starts_with(".o.wav.") && n.ends_with(".tmp")) {
            assert!(start.elapsed().as_secs() < 60, "no temporary appeared: {:?}", dir_names(dir.path()));
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        let o = wait_or_kill(child, std::time::Duration::from_secs(60), "interrupted tts");
        assert_eq!(o.status.code(), Some(code), "{}", stderr(&o));
        assert_eq!(dir_names(dir.path()), ["profile.toml"], "signal {signal}");
    }
}

/// A bug in the host while writing: one line, exit 1, the temporary removed.
#[test]
fn panic_while_writing_leaves_no_temporary() {
    let (plugins, gguf) = tone_setup(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &[gguf]);
    let out = dir.path().join("o.wav");
    let o = run_with(&args(&profile, plugins.path(), "hi", &out), None, &[(engine_core::output::TEST_FAULT_ENV, "panic")]);
    assert_refused(&o, "internal error (a bug in tts): TTS_TEST_OUTPUT_FAULT=panic at ", dir.path(), &["profile.toml"]);
}

/// A panic inside a model plugin becomes the plugin's one-line error instead
/// of aborting the process at the plugin boundary.
#[test]
fn plugin_panic_is_an_error_not_an_abort() {
    let (plugins, gguf) = tone_setup(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &[gguf]);
    let out = dir.path().join("o.wav");
    let mut a = args(&profile, plugins.path(), "hi", &out);
    a.extend(["--set", "panic=true"]);
    assert_refused(&run(&a), "tone model: internal error (a bug, please report it): index out of bounds", dir.path(), &["profile.toml"]);
}

#[test]
fn directories_and_sockets_are_refused_as_output() {
    let (plugins, gguf) = tone_setup(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &[gguf]);
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    assert_one_line_error(&run(&args(&profile, plugins.path(), "hi", &sub)), "sub is a directory");
    let socket = dir.path().join("sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    assert_one_line_error(&run(&args(&profile, plugins.path(), "hi", &socket)), "sock is a socket");
    assert_eq!(dir_names(dir.path()), ["profile.toml", "sock", "sub"]);
}

/// A model whose samples would come out NaN is an error, not a silent WAV:
/// the NaN weight is refused at load, naming it (tests/model_values.rs has
/// the rest of the finiteness checks).
#[test]
fn non_finite_samples_are_an_error() {
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("nan.gguf");
    let mut e = GgufEditor::open(&supertonic_fixture()).unwrap();
    e.fill_f32("voc.head2.weight", f32::NAN).unwrap();
    e.write(&bad).unwrap();
    let profile = profile_on(dir.path(), "cpu", &[bad]);
    let out = dir.path().join("o.wav");
    assert_refused(
        &run(&args(&profile, plugins.path(), "Hello.", &out)),
        "nan.gguf: tensor 'voc.head2.weight' holds ",
        dir.path(),
        &["nan.gguf", "profile.toml"],
    );
}

// 2. Libraries are never loaded from the working directory.

/// A `libvulkan.so.1` planted in the working directory: its constructor would
/// write a marker. `tts devices` on a profile that opens Vulkan must not load
/// it (Vulkan stays available, no marker). The control: found through
/// `LD_LIBRARY_PATH`, the planted library does replace the real loader, and
/// the Vulkan module then fails on the symbols it lacks.
#[test]
fn library_planted_in_the_working_directory_is_not_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("planted-library-ran");
    let source = dir.path().join("plant.c");
    std::fs::write(
        &source,
        format!(
            "#include <stdio.h>\n__attribute__((constructor)) static void planted(void) {{ FILE *f = fopen(\"{}\", \"w\"); if (f) fclose(f); }}\n",
            marker.display()
        ),
    )
    .unwrap();
    let status = std::process::Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(dir.path().join("libvulkan.so.1")).arg(&source).status().unwrap();
    assert!(status.success(), "compiling the planted library");
    // The build tree as a user runs it: run paths only, no LD_LIBRARY_PATH.
    let devices = |library_path: Option<&Path>| {
        let mut cmd = std::process::Command::new(tts());
        cmd.args(["devices", "--profile"]).arg(repo().join("profiles/ci.toml")).current_dir(dir.path()).env_remove("LD_LIBRARY_PATH").env_remove("TTS_LOG");
        if let Some(p) = library_path {
            cmd.env("LD_LIBRARY_PATH", p);
        }
        wait_or_kill(
            cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap(),
            std::time::Duration::from_secs(120),
            "tts devices",
        )
    };
    let o = devices(None);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!marker.exists(), "a library in the working directory was loaded");
    let report = String::from_utf8_lossy(&o.stdout);
    assert!(report.contains("backend vulkan") && !report.contains("backend vulkan: unavailable"), "{report}");
    let o = devices(Some(dir.path()));
    let report = String::from_utf8_lossy(&o.stdout);
    assert!(report.contains("backend vulkan: unavailable") && report.contains("undefined symbol: vk"), "control: {report}");
}

// 3. Malformed model metadata: refused by key, before any graph is built.

#[test]
fn malformed_supertonic_metadata_is_refused_by_key() {
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let src = supertonic_fixture();
    let cases: Vec<(&str, PathBuf, &str)> = vec![
        (
            "heads",
            crafted(dir.path(), "heads.gguf", &src, |e| {
                e.set_u32("supertonic.dp.attn.heads", 0);
            }),
            "metadata supertonic.dp.attn.heads = 0 is out of range (1..=256)",
        ),
        (
            "char_emb",
            crafted(dir.path(), "emb.gguf", &src, |e| {
                e.reshape("dp.char_emb", &[174, 16]).unwrap();
            }),
            "tensor 'dp.char_emb' has shape [174, 16], the metadata implies [16, vocab]",
        ),
        (
            "latent",
            crafted(dir.path(), "latent.gguf", &src, |e| {
                e.set_u32("supertonic.latent_dim", 1 << 30);
            }),
            "metadata supertonic.latent_dim = 1073741824 is out of range (1..=4096)",
        ),
        (
            "rate",
            crafted(dir.path(), "rate.gguf", &src, |e| {
                e.set_u32("supertonic.sample_rate", u32::MAX);
            }),
            "metadata supertonic.sample_rate = 4294967295 is out of range (8000..=192000)",
        ),
        (
            "steps",
            crafted(dir.path(), "steps.gguf", &src, |e| {
                e.set_u32("supertonic.default_steps", 1_000_000);
            }),
            "metadata supertonic.default_steps = 1000000 is out of range (1..=100)",
        ),
        (
            "scale0",
            crafted(dir.path(), "scale0.gguf", &src, |e| {
                e.set_f32("supertonic.normalizer_scale", 0.0);
            }),
            "metadata supertonic.normalizer_scale = 0 is out of range",
        ),
        (
            "scalenan",
            crafted(dir.path(), "scalenan.gguf", &src, |e| {
                e.set_f32("supertonic.normalizer_scale", f32::NAN);
            }),
            "metadata supertonic.normalizer_scale = NaN is out of range",
        ),
        (
            "type",
            crafted(dir.path(), "type.gguf", &src, |e| {
                e.set_str("supertonic.ve.blocks", "two");
            }),
            "metadata key 'supertonic.ve.blocks' has type str",
        ),
        // Weights that make the duration predictor say 5e21 s: bounded before any buffer grows with it.
        (
            "duration",
            crafted(dir.path(), "dur.gguf", &src, |e| {
                e.fill_f32("dp.pred.1.bias", 50.0).unwrap();
            }),
            "s for a chunk of 6 characters (allowed: 0..=120 s); the model file may be corrupt",
        ),
    ];
    let mut names: Vec<String> = cases.iter().map(|(_, p, _)| p.file_name().unwrap().to_string_lossy().into()).collect();
    names.push("profile.toml".into());
    names.sort();
    for (what, file, want) in cases {
        let profile = profile_on(dir.path(), "cpu", &[file]);
        let out = dir.path().join("o.wav");
        let o = run(&args(&profile, plugins.path(), "Hello.", &out));
        assert_one_line_error(&o, want);
        assert_eq!(dir_names(dir.path()), names, "{what}: no output or temporary");
    }
}

#[test]
fn malformed_s3gen_metadata_is_refused_by_key() {
    let plugins = plugins_with(&["cpu"], &["chatterbox"]);
    let dir = tempfile::tempdir().unwrap();
    let [t3, s3] = <[PathBuf; 2]>::try_from(chatterbox_fixture()).unwrap();
    let cases = [
        (
            crafted(dir.path(), "rate.gguf", &s3, |e| {
                e.set_u32("chatterbox-s3gen.hift.sample_rate", 0);
            }),
            "metadata chatterbox-s3gen.hift.sample_rate = 0 is out of range (8000..=192000)",
        ),
        (
            crafted(dir.path(), "harm.gguf", &s3, |e| {
                e.set_u32("chatterbox-s3gen.hift.harmonics", 100_000);
            }),
            "metadata chatterbox-s3gen.hift.harmonics = 100000 is out of range (0..=64)",
        ),
        (
            crafted(dir.path(), "rates.gguf", &s3, |e| {
                e.set_u32_array("chatterbox-s3gen.hift.upsample_rates", &[8, 5]);
            }),
            "HiFT upsample rates, kernels and source resblocks disagree in count",
        ),
    ];
    for (file, want) in cases {
        let profile = profile_on(dir.path(), "cpu", &[t3.clone(), file]);
        let out = dir.path().join("o.wav");
        assert_one_line_error(&run(&args(&profile, plugins.path(), "Hello.", &out)), want);
        assert!(!out.exists());
    }
    // A tokenizer that does not load names its file.
    let bad_tok = crafted(dir.path(), "t3-badtok.gguf", &t3, |e| {
        e.set_str("chatterbox.tokenizer_json", "{not json");
    });
    let profile = profile_on(dir.path(), "cpu", &[bad_tok, s3]);
    assert_one_line_error(&run(&args(&profile, plugins.path(), "Hello.", &dir.path().join("o.wav"))), "t3-badtok.gguf: chatterbox.tokenizer_json: ");
}

// 4. Threads.

#[test]
fn cpu_threads_beyond_the_core_count_are_refused() {
    let (plugins, gguf) = tone_setup(&["cpu"]);
    let cores = std::thread::available_parallelism().unwrap().get();
    let dir = tempfile::tempdir().unwrap();
    for threads in [i32::MAX as i64, cores as i64 + 1, -1] {
        let profile = write_profile(
            dir.path(),
            &format!("[backend]\nprefer = [\"cpu\"]\n[backends.cpu]\nthreads = {threads}\n[model]\nfiles = [\"{}\"]\n", gguf.display()),
        );
        let out = dir.path().join("o.wav");
        let want = format!("[backends.cpu] threads = {threads}: this machine has {cores} cores; use 0 (one thread per core) or 1..={cores}");
        assert_one_line_error(&run(&args(&profile, plugins.path(), "hi", &out)), &want);
        assert!(!out.exists());
    }
}

// 5. Errors that name the real cause.

#[test]
fn model_paths_that_are_not_readable_files() {
    let (plugins, _) = tone_setup(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.wav");
    let sub = dir.path().join("models");
    std::fs::create_dir(&sub).unwrap();
    let fifo = dir.path().join("model.fifo");
    mkfifo(&fifo);
    for (model, want) in [(&sub, "models is a directory, not a regular file"), (&fifo, "model.fifo is a FIFO, not a regular file")] {
        let profile = profile_on(dir.path(), "cpu", std::slice::from_ref(model));
        assert_one_line_error(&run(&args(&profile, plugins.path(), "hi", &out)), want);
    }
    // Unreadable: as root, run without the capability that overrides permissions.
    let locked = dir.path().join("locked.gguf");
    std::fs::copy(supertonic_fixture(), &locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    let profile = profile_on(dir.path(), "cpu", std::slice::from_ref(&locked));
    let a = args(&profile, plugins.path(), "hi", &out);
    let o = if std::fs::File::open(&locked).is_ok() {
        let mut cmd = std::process::Command::new("setpriv");
        cmd.args(["--bounding-set", "-dac_override,-dac_read_search", "--"]).arg(tts()).args(&a).env_remove("TTS_LOG");
        cmd.output().expect("setpriv (util-linux) runs tts without the permission override")
    } else {
        run(&a)
    };
    assert_one_line_error(&o, "cannot read GGUF file ");
    assert!(stderr(&o).contains("locked.gguf: Permission denied"), "{}", stderr(&o));
    assert!(!out.exists());
}

#[test]
fn profile_for_another_family_says_so() {
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.wav");
    let turbo = repo().join("profiles/turbo.toml");
    let model = supertonic_fixture();
    let mut a = vec!["--profile", turbo.to_str().unwrap(), "--plugin-dir", plugins.path().to_str().unwrap(), "--model", model.to_str().unwrap()];
    a.extend(["--text", "Hello.", "--out", out.to_str().unwrap()]);
    assert_one_line_error(
        &run(&a),
        "unknown key `temperature` in [synthesis]: the supertonic model takes voice, language, steps, speed, seed, noise_npy, unsupported_chars, stream_first_chars (is this profile written for another model family?)",
    );
    assert!(!out.exists());
}

#[test]
fn command_line_mistakes_name_the_real_cause() {
    let (plugins, gguf) = tone_setup(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.wav");
    let profile = profile_on(dir.path(), "cpu", std::slice::from_ref(&gguf));
    let model = gguf.to_str().unwrap();
    let mut a = args(&profile, plugins.path(), "hi", &out);
    a.extend(["--model", model, "--model", model]);
    assert_one_line_error(&run(&a), "tone.gguf is given twice");
    for value in ["1e400", "nan", "inf"] {
        let mut a = args(&profile, plugins.path(), "hi", &out);
        let set = format!("gain={value}");
        a.extend(["--set", &set]);
        assert_one_line_error(&run(&a), &format!("option `gain`: `{value}` is not a finite float"));
    }
    let mut a = args(&profile, plugins.path(), "hi", &out);
    a.extend(["--set", "fail=maybe"]);
    assert_one_line_error(&run(&a), "option `fail`: `maybe` is not a boolean");
    let device = write_profile(dir.path(), &format!("[backend]\nprefer = [\"cpu\"]\ndevice = -1\n[model]\nfiles = [\"{model}\"]\n"));
    assert_one_line_error(
        &run(&args(&device, plugins.path(), "hi", &out)),
        "key `device`: use \"auto\", a device name like \"Vulkan0\", a bus id like \"0000:01:00.0\", or a device index 0..=4294967295; found -1",
    );
    assert!(!out.exists());
}

#[test]
fn seed_beyond_64_bits_is_out_of_range_not_a_non_integer() {
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &[supertonic_fixture()]);
    let out = dir.path().join("o.wav");
    let mut a = args(&profile, plugins.path(), "Hello.", &out);
    a.extend(["--set", "seed=18446744073709551616"]);
    assert_one_line_error(&run(&a), "option `seed`: `18446744073709551616` is out of range for an integer option");
    let mut a = args(&profile, plugins.path(), "Hello.", &out);
    a.extend(["--set", "seed=4294967296"]);
    assert_one_line_error(&run(&a), "seed must be in 0..=4294967295, got 4294967296");
    assert!(!out.exists());
}

#[test]
fn draws_that_name_a_file_say_so() {
    let plugins = plugins_with(&["cpu"], &["chatterbox"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &chatterbox_fixture());
    let out = dir.path().join("o.wav");
    let mut a = args(&profile, plugins.path(), "Hello.", &out);
    let file = chatterbox_fixture()[0].display().to_string();
    let set = format!("draws={file}");
    a.extend(["--set", &set]);
    assert_one_line_error(&run(&a), "t3-turbo.gguf is not a directory (name a directory of recorded .npy draws)");
    assert!(!out.exists());
}

// 6. Chatterbox splits words longer than max_chars.

#[test]
fn chatterbox_splits_a_word_longer_than_max_chars() {
    let plugins = plugins_with(&["cpu"], &["chatterbox"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &chatterbox_fixture());
    let out = dir.path().join("o.wav");
    let word = "a".repeat(200);
    let mut a = args(&profile, plugins.path(), &word, &out);
    a.extend(["--set", "max_chars=50", "--set", "max_new_tokens=8", "--set", "temperature=0"]);
    let o = run(&a);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(is_wav(&out));
}

// 7. Files and code loading, round two (issue 31).

/// Runs `tts args` with its stdout on `stdout` (a file of the test's own
/// temporary directory), so `--out /dev/stdout` reaches that file.
fn run_with_stdout(args: &[&str], stdout: std::fs::File, envs: &[(&str, &str)]) -> Output {
    let mut cmd = std::process::Command::new(tts());
    cmd.args(args).env_remove("TTS_LOG").env_remove("TTS_PLUGIN_PATH").envs(envs.iter().copied());
    cmd.stdout(std::process::Stdio::from(stdout)).stderr(std::process::Stdio::piped());
    wait_or_kill(cmd.spawn().unwrap(), std::time::Duration::from_secs(120), &format!("tts {}", args.join(" ")))
}

/// `tts --out /dev/stdout > x.wav` left x.wav empty and, as root, renamed a
/// WAV over the `/dev/stdout` link itself. Now the WAV goes through the
/// descriptor into x.wav: from byte 0 for `>` (older bytes cut), appended
/// for `>>`. The test never names `/dev/stdout` itself (a regression would
/// rename over the machine's node again): it writes through links of its own
/// in its temporary directory, one to `/dev/stdout` and one to
/// `/proc/self/fd/1`, which take the same path through the writer (before the
/// fix such a link was replaced by the WAV and x.wav left empty). The child's
/// stdout is always a file in this test's temporary directory.
#[test]
fn out_dev_stdout_writes_into_the_redirected_file() {
    let (plugins, gguf) = tone_setup(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &[gguf]);
    let links = [dir.path().join("stdout.wav"), dir.path().join("fd1.wav")];
    symlink("/dev/stdout", &links[0]).unwrap();
    symlink("/proc/self/fd/1", &links[1]).unwrap();
    for (i, out) in links.iter().enumerate() {
        // `> x.wav`, over an older, longer file (the shell truncates; the
        // descriptor starts at 0 either way).
        let x = dir.path().join(format!("x{i}.wav"));
        std::fs::write(&x, vec![7u8; 100_000]).unwrap();
        let file = std::fs::OpenOptions::new().write(true).truncate(true).open(&x).unwrap();
        let o = run_with_stdout(&args(&profile, plugins.path(), "hi", out), file, &[]);
        assert!(o.status.success(), "{}", stderr(&o));
        let wav = hound::WavReader::open(&x).unwrap_or_else(|e| panic!("{}: not a WAV ({e}), {} bytes", out.display(), std::fs::metadata(&x).unwrap().len()));
        assert_eq!(wav.len(), 2 * 1600, "{}: 0.1 s per character at 16 kHz", out.display());
        assert_eq!(std::fs::metadata(&x).unwrap().len(), 44 + 2 * 3200, "nothing trails the WAV");
        // `>> x.wav`: appended after what was there, header sizes rewritten,
        // and the shared description keeps its append flag.
        let before = std::fs::read(&x).unwrap();
        let file = std::fs::OpenOptions::new().append(true).open(&x).unwrap();
        let ours = file.try_clone().unwrap();
        let o = run_with_stdout(&args(&profile, plugins.path(), "hi", out), file, &[]);
        assert!(o.status.success(), "{}", stderr(&o));
        let after = std::fs::read(&x).unwrap();
        assert_eq!(&after[..before.len()], &before[..], "the older content is kept");
        let appended = hound::WavReader::new(std::io::Cursor::new(after[before.len()..].to_vec())).unwrap();
        assert_eq!(appended.len(), 2 * 1600);
        let flags = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&ours), libc::F_GETFL) };
        assert_ne!(flags & libc::O_APPEND, 0, "the caller's O_APPEND is kept");
        assert!(std::fs::symlink_metadata(out).unwrap().file_type().is_symlink(), "{}: our link is kept", out.display());
    }
    assert!(std::fs::symlink_metadata("/dev/stdout").unwrap().file_type().is_symlink(), "/dev/stdout is still a link");
}

/// An output that is one of the inputs (the model, the text file, the
/// reference of `voice save`, through a link too) is refused before anything
/// is written, with one line; the input is untouched. (`--format wav` names
/// the format: the inputs' extensions are no audio format's.)
#[test]
fn output_that_is_an_input_is_refused() {
    let (plugins, gguf) = tone_setup(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", std::slice::from_ref(&gguf));
    let model = std::fs::read(&gguf).unwrap();
    let link = dir.path().join("model-link.gguf");
    symlink(&gguf, &link).unwrap();
    for out in [&gguf, &link] {
        let mut a = args(&profile, plugins.path(), "hi", out);
        a.extend(["--format", "wav"]);
        let o = run(&a);
        assert_one_line_error(&o, &format!("is the model file {}; writing it would destroy that input", gguf.display()));
        assert_eq!(std::fs::read(&gguf).unwrap(), model, "the model is untouched");
    }
    let mut a = args(&profile, plugins.path(), "hi", &gguf);
    let model_arg = gguf.to_str().unwrap();
    a.extend(["--model", model_arg, "--format", "wav"]);
    assert_one_line_error(&run(&a), "is the model file");
    let text = dir.path().join("t.txt");
    std::fs::write(&text, "hello").unwrap();
    let o = run(&[
        "--profile",
        profile.to_str().unwrap(),
        "--plugin-dir",
        plugins.path().to_str().unwrap(),
        "--text-file",
        text.to_str().unwrap(),
        "--out",
        text.to_str().unwrap(),
        "--format",
        "wav",
    ]);
    assert_one_line_error(&o, "is the text file");
    assert_eq!(std::fs::read_to_string(&text).unwrap(), "hello");
    // voice save --reference r.wav --out r.wav (Chatterbox: refused before cloning).
    let plugins = plugins_with(&["cpu"], &["chatterbox"]);
    let profile = profile_on(dir.path(), "cpu", &chatterbox_fixture());
    let reference = dir.path().join("r.wav");
    std::fs::write(&reference, b"RIFF-not-even-audio").unwrap();
    let o = save_voice(&profile, plugins.path(), &reference, &reference);
    assert_one_line_error(&o, &format!("is the reference {}", reference.display()));
    assert_eq!(std::fs::read(&reference).unwrap(), b"RIFF-not-even-audio");
}

/// Only values the model opens as files count as inputs: `--set voice=F1
/// --out F1` (F1 a built-in voice, and a file of that name in the working
/// directory) was refused as "the voice file F1". A voice style JSON given
/// as `voice` is still an input.
#[test]
fn a_built_in_voice_name_is_not_an_input_file() {
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &[supertonic_fixture()]);
    std::fs::write(dir.path().join("F1"), b"an older file named like the voice").unwrap();
    let mut a = args(&profile, plugins.path(), "Hello.", Path::new("F1"));
    a.extend(["--set", "voice=F1", "--set", "steps=2"]);
    let o = run_with(&a, Some(dir.path()), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(is_wav(&dir.path().join("F1")));
    let style = dir.path().join("style.json");
    std::fs::write(&style, b"{}").unwrap();
    let set = format!("voice={}", style.display());
    let mut a = args(&profile, plugins.path(), "Hello.", &style);
    a.extend(["--set", &set, "--format", "wav"]);
    assert_one_line_error(&run(&a), &format!("is the voice file {}", style.display()));
    assert_eq!(std::fs::read(&style).unwrap(), b"{}");
}

/// Plugin directories come from --plugin-dir, TTS_PLUGIN_PATH or the bundle;
/// a profile's `[plugins] dirs` loads code only with --trust-profile-plugins.
/// A plugin file or directory that others may write, or that another user
/// owns, is refused with its reason.
#[test]
fn plugins_load_only_from_trusted_places() {
    let (plugins, gguf) = tone_setup(&["cpu"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.wav");
    let model = gguf.to_str().unwrap();
    let profile = write_profile(
        dir.path(),
        &format!(
            "[plugins]\ndirs = [\"{}\"]\n[backend]\nprefer = [\"cpu\"]\n[backends.cpu]\nthreads = 1\n[model]\nfiles = [\"{model}\"]\n",
            plugins.path().display()
        ),
    );
    let base = ["--profile", profile.to_str().unwrap(), "--text", "hi", "--out", out.to_str().unwrap()];
    let o = run_with(&base, None, &[("TTS_PLUGIN_PATH", "")]);
    assert_one_line_error(&o, "[plugins] dirs would load code from");
    assert!(stderr(&o).contains("pass --trust-profile-plugins to allow it"), "{}", stderr(&o));
    assert!(!out.exists());
    let mut trusted = base.to_vec();
    trusted.push("--trust-profile-plugins");
    let o = run(&trusted);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::remove_file(&out).unwrap();
    // The environment variable, with a profile that names no plugins.
    let plain = profile_on(dir.path(), "cpu", std::slice::from_ref(&gguf));
    let env_args = ["--profile", plain.to_str().unwrap(), "--text", "hi", "--out", out.to_str().unwrap()];
    let o = run_with(&env_args, None, &[("TTS_PLUGIN_PATH", plugins.path().to_str().unwrap())]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::remove_file(&out).unwrap();
    // StrictModes: a writable directory, a writable file, a file of another user.
    let with_dir = args(&plain, plugins.path(), "hi", &out);
    let model_plugin = plugins.path().join("libtts_model_tone.so");
    std::fs::set_permissions(plugins.path(), std::fs::Permissions::from_mode(0o775)).unwrap();
    assert_one_line_error(&run(&with_dir), "is writable by its group (mode 0775); remove that with chmod go-w");
    std::fs::set_permissions(plugins.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(&model_plugin, std::fs::Permissions::from_mode(0o757)).unwrap();
    assert_one_line_error(&run(&with_dir), "libtts_model_tone.so is writable by anyone (mode 0757)");
    std::fs::set_permissions(&model_plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    if has_capability(CAP_CHOWN) {
        let me = unsafe { libc::geteuid() };
        std::os::unix::fs::chown(&model_plugin, Some(4242), None).unwrap();
        assert_one_line_error(&run(&with_dir), "libtts_model_tone.so is owned by user 4242, neither root nor this user");
        std::os::unix::fs::chown(&model_plugin, Some(me), None).unwrap();
    } else {
        eprintln!("skipped: a plugin owned by another user (giving a file away needs root, CAP_CHOWN); the other StrictModes cases ran");
    }
    assert!(!out.exists());
    let o = run(&with_dir);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// A FIFO as a voice, a reference recording, a noise or draws file, or a
/// text file that is a directory, is refused by kind with one line at once
/// (a FIFO blocked for ever); a device as a voice or noise file too (it was
/// read without a cap until memory ran out).
#[test]
fn special_files_as_inputs_are_refused_by_kind() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.wav");
    let fifo = dir.path().join("in.json");
    mkfifo(&fifo);
    let fifo_npy = dir.path().join("noise.npy");
    mkfifo(&fifo_npy);
    // A character device of our own (what /dev/zero is), where the container allows it.
    let device = dir.path().join("zero.json");
    let c = std::ffi::CString::new(device.to_str().unwrap()).unwrap();
    let have_device = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 5)) } == 0;
    if has_capability(CAP_MKNOD) {
        assert!(have_device, "mknod of a character device failed with CAP_MKNOD: {}", std::io::Error::last_os_error());
    } else if !have_device {
        eprintln!("skipped: a character device as voice or noise (mknod needs root, CAP_MKNOD); the FIFO cases ran");
    }
    let supertonic = plugins_with(&["cpu"], &["supertonic"]);
    let profile = profile_on(dir.path(), "cpu", &[supertonic_fixture()]);
    let mut cases = vec![
        (format!("voice={}", fifo.display()), "is a FIFO, not a regular file"),
        (format!("noise_npy={}", fifo_npy.display()), "noise.npy is a FIFO, not a regular file"),
    ];
    if have_device {
        cases.push((format!("voice={}", device.display()), "zero.json is a character device, not a regular file"));
        cases.push((format!("noise_npy={}", device.display()), "zero.json is a character device, not a regular file"));
    }
    for (set, want) in &cases {
        let mut a = args(&profile, supertonic.path(), "Hello.", &out);
        a.extend(["--set", set]);
        assert_one_line_error(&run(&a), want);
    }
    let chatterbox = plugins_with(&["cpu"], &["chatterbox"]);
    let profile = profile_on(dir.path(), "cpu", &chatterbox_fixture());
    let draws = dir.path().join("draws");
    std::fs::create_dir(&draws).unwrap();
    mkfifo(&draws.join("t3_uniforms.npy"));
    for (set, want) in [
        (format!("voice={}", fifo.display()), "voice file"),
        (format!("reference_audio={}", fifo.display()), "audio file"),
        (format!("draws={}", draws.display()), "t3_uniforms.npy is a FIFO, not a regular file"),
    ] {
        let mut a = args(&profile, chatterbox.path(), "Hello.", &out);
        a.extend(["--set", &set]);
        let o = run(&a);
        assert_one_line_error(&o, want);
        assert!(stderr(&o).contains("is a FIFO, not a regular file"), "{}", stderr(&o));
    }
    let o = run(&[
        "--profile",
        profile.to_str().unwrap(),
        "--plugin-dir",
        chatterbox.path().to_str().unwrap(),
        "--text-file",
        dir.path().to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_one_line_error(&o, "is a directory; text comes from a regular file or a pipe");
    assert!(!out.exists());
}
