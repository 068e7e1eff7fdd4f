//! The cost of text (`docs/reliability.md`, "Cost of text"): a letter with
//! thousands of combining marks is one grapheme cluster, which used to pass
//! every cut and become one chunk whose attention grew with the square of its
//! length (4,000 marks: 20 s and 1.79 GB). Both families, through the CLI,
//! with the tiny committed fixtures on the CPU; peak RSS is the child's own
//! (`VmHWM`), time its wall time.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One finished `tts` run: exit code, wall time, peak RSS, output.
struct Measured {
    code: Option<i32>,
    seconds: f64,
    peak_rss_mib: f64,
    stdout: Vec<u8>,
    stderr: String,
}

/// The peak resident memory (`VmHWM`) of a live process, MiB; None once it
/// has exited.
fn vm_hwm_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib / 1024.0)
}

/// Runs `tts args`, its stdout read to the end, or only its first `read_at_most`
/// bytes before the pipe is closed (the reader goes away). Its peak RSS is its
/// own `VmHWM`, read every 2 ms while it runs (`wait4`'s `ru_maxrss` would
/// include the test process's size from before the exec). Killed (and
/// failing) after `limit`.
fn measure(args: &[&str], read_at_most: Option<usize>, limit: Duration) -> Measured {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let err_path = dir.path().join("stderr");
    let mut child = std::process::Command::new(tts())
        .args(args)
        .env_remove("TTS_LOG")
        .env_remove(engine_core::output::TEST_FAULT_ENV)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let pipe = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        match read_at_most {
            Some(n) => pipe.take(n as u64).read_to_end(&mut bytes),
            None => { pipe }.read_to_end(&mut bytes),
        }
        .unwrap();
        bytes // the pipe is closed here
    });
    let mut peak = 0f64;
    let status = loop {
        if let Some(hwm) = vm_hwm_mib(child.id()) {
            peak = peak.max(hwm);
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("tts {}: still running after {limit:?}", args.join(" ").chars().take(200).collect::<String>());
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let seconds = start.elapsed().as_secs_f64();
    let stdout = reader.join().unwrap();
    assert!(peak > 0.0, "no reading of the child's memory");
    Measured { code: status.code(), seconds, peak_rss_mib: peak, stdout, stderr: std::fs::read_to_string(&err_path).unwrap() }
}

/// `tts` on `family`'s fixture synthesising `text` to `out` (`-`: stdout).
fn args(profile: &Path, plugins: &Path, text: &str, out: &str, sets: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["--profile", profile.to_str().unwrap(), "--plugin-dir", plugins.to_str().unwrap(), "--text", text, "--out", out]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for s in sets {
        a.extend(["--set".to_string(), s.to_string()]);
    }
    a
}

struct Family {
    name: &'static str,
    files: Vec<PathBuf>,
    /// Short generations keep the Chatterbox runs quick, and the tiny T3's
    /// context (160 positions) needs short chunks; the same for every input.
    sets: &'static [&'static str],
}

fn families() -> Vec<Family> {
    vec![
        Family { name: "supertonic", files: vec![supertonic_fixture()], sets: &[] },
        Family { name: "chatterbox", files: chatterbox_fixture(), sets: &["max_new_tokens=20", "max_chars=60"] },
    ]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `a` + 4,000 × U+0301 keeps its first marks (a warning says how many were
/// left out), so it is spoken as a chunk of 32 code points: the same audio as
/// the capped text, in less than twice the time of 4,000 plain letters (the
/// medians of three runs each), with no more peak RSS than they take.
#[test]
fn combining_marks_cost_no_more_than_plain_letters() {
    let marks = format!("a{}", "\u{301}".repeat(4000));
    let capped = format!("a{}", "\u{301}".repeat(engine_core::model_kit::text::MAX_CLUSTER_CHARS - 1));
    let letters = "a".repeat(4000);
    for family in families() {
        let plugins = plugins_with(&["cpu"], &[family.name]);
        let dir = tempfile::tempdir().unwrap();
        let profile = profile_on(dir.path(), "cpu", &family.files);
        let run = |text: &str, out: &Path| {
            let a = args(&profile, plugins.path(), text, out.to_str().unwrap(), family.sets);
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            let m = measure(&a, None, Duration::from_secs(300));
            assert_eq!(m.code, Some(0), "{}: {}", family.name, m.stderr);
            m
        };
        let (wav_marks, wav_capped, wav_letters) = (dir.path().join("marks.wav"), dir.path().join("capped.wav"), dir.path().join("letters.wav"));
        let (mut t_marks, mut t_letters, mut rss_marks, mut rss_letters) = (Vec::new(), Vec::new(), 0f64, 0f64);
        for _ in 0..3 {
            let m = run(&marks, &wav_marks);
            assert!(m.stderr.contains("3969 combining characters were left out"), "{}: {}", family.name, m.stderr);
            t_marks.push(m.seconds);
            rss_marks = rss_marks.max(m.peak_rss_mib);
            let l = run(&letters, &wav_letters);
            t_letters.push(l.seconds);
            rss_letters = rss_letters.max(l.peak_rss_mib);
        }
        run(&capped, &wav_capped);
        assert_eq!(std::fs::read(&wav_marks).unwrap(), std::fs::read(&wav_capped).unwrap(), "{}: spoken as the capped text", family.name);
        let (tm, tl) = (median(t_marks), median(t_letters));
        eprintln!(
            "{}: 4000 marks {tm:.3} s, {rss_marks:.1} MiB; 4000 letters {tl:.3} s, {rss_letters:.1} MiB; time ratio {:.2} (limit 2)",
            family.name,
            tm / tl
        );
        assert!(tm <= 2.0 * tl, "{}: the marks took {tm:.3} s, the letters {tl:.3} s", family.name);
        // 4 MiB of slack for allocator noise between processes.
        assert!(rss_marks <= rss_letters + 4.0, "{}: peak RSS {rss_marks:.1} MiB for the marks, {rss_letters:.1} MiB for the letters", family.name);
    }
}

/// Ordinary prose of `bytes` bytes in paragraphs.
fn prose(bytes: usize) -> String {
    let paragraph = "The quick brown fox jumps over the lazy dog. Dr. Smith, who came late, said: \"It is fine!\" Then we left at 9.30 p.m.\n\n";
    paragraph.repeat(bytes / paragraph.len() + 1)[..bytes].to_string()
}

/// 1 MB of text needs no more memory than 10 KB beyond the constant in
/// `docs/reliability.md`: both streamed to stdout, whose reader stops after
/// 256 KiB (the synthesis then stops), and both to a WAV file with a short
/// text and a text of 16 chunks, whose audio goes to the file as it is made.
#[test]
fn memory_does_not_grow_with_the_text() {
    const TEXT_CONSTANT_MIB: f64 = 32.0;
    for family in families() {
        let plugins = plugins_with(&["cpu"], &[family.name]);
        let dir = tempfile::tempdir().unwrap();
        let profile = profile_on(dir.path(), "cpu", &family.files);
        let mut peak = Vec::new();
        for bytes in [10_000, 1_000_000] {
            let file = dir.path().join(format!("text-{bytes}.txt"));
            std::fs::write(&file, prose(bytes)).unwrap();
            let mut a = args(&profile, plugins.path(), "-", "-", family.sets);
            a.splice(4..6, ["--text-file".to_string(), file.to_str().unwrap().to_string()]);
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            let m = measure(&a, Some(256 << 10), Duration::from_secs(300));
            assert_eq!(m.code, Some(0), "{}: {}", family.name, m.stderr);
            assert_eq!(m.stdout.len(), 256 << 10, "{}: the reader took what it wanted", family.name);
            eprintln!("{}: {bytes} bytes of text to a closed pipe: {:.2} s, peak RSS {:.1} MiB", family.name, m.seconds, m.peak_rss_mib);
            peak.push(m.peak_rss_mib);
        }
        assert!(peak[1] <= peak[0] + TEXT_CONSTANT_MIB, "{}: peak RSS {:.1} MiB for 1 MB of text, {:.1} MiB for 10 KB", family.name, peak[1], peak[0]);
    }
}

/// A WAV or FLAC file gets its audio as it is made: 20 KB of text (about
/// 11.7 MB of WAV) takes no more memory than 10 KB (held whole, the audio took
/// 6 bytes a sample as WAV, about 20 as FLAC: 17 and 56 MiB more). The FLAC
/// holds the WAV's samples, and both headers give the real sizes.
/// Supertonic only, for time; Chatterbox goes through the same host code.
#[test]
fn audio_files_are_written_as_the_audio_is_made() {
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = profile_on(dir.path(), "cpu", &[supertonic_fixture()]);
    for format in ["wav", "flac"] {
        let mut peak = Vec::new();
        for bytes in [10_000, 20_000] {
            let text = dir.path().join(format!("text-{bytes}.txt"));
            std::fs::write(&text, prose(bytes)).unwrap();
            let out = dir.path().join(format!("{bytes}.{format}"));
            let mut a = args(&profile, plugins.path(), "-", out.to_str().unwrap(), &[]);
            a.splice(4..6, ["--text-file".to_string(), text.to_str().unwrap().to_string()]);
            a.extend(["--format".to_string(), format.to_string()]);
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            let m = measure(&a, None, Duration::from_secs(300));
            assert_eq!(m.code, Some(0), "{}", m.stderr);
            let size = std::fs::metadata(&out).unwrap().len();
            eprintln!("supertonic: {bytes} bytes of text to a {size}-byte {format}: {:.2} s, peak RSS {:.1} MiB", m.seconds, m.peak_rss_mib);
            peak.push(m.peak_rss_mib);
        }
        assert!(peak[1] <= peak[0] + 8.0, "{format}: peak RSS {:.1} MiB for 20 KB of text, {:.1} MiB for 10 KB", peak[1], peak[0]);
    }
    let (rate, wav) = read_wav(&dir.path().join("20000.wav"));
    assert_eq!(rate, 44100);
    assert_eq!(std::fs::metadata(dir.path().join("20000.wav")).unwrap().len(), 44 + 2 * wav.len() as u64, "the WAV header gives the real sizes");
    let flac = engine_core::audio::input::read_mono(&dir.path().join("20000.flac"), 1e6).unwrap();
    assert_eq!(flac.sample_rate, 44100);
    let as_pcm = |v: &[f32], scale: f32| v.iter().map(|s| (s * scale).round() as i16).collect::<Vec<_>>();
    assert_eq!(as_pcm(&flac.samples, 32768.0), as_pcm(&wav, i16::MAX as f32), "the FLAC holds the WAV's samples");
}

/// A child killed and reaped when the test ends, however it ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `tts serve` shares the engine path: one request of `a` + 4,000 marks (8 KB)
/// took the server to 1.8 GB. Now its peak RSS stays where a request of
/// 4,000 plain letters left it.
#[test]
fn the_server_pays_no_more_for_marks_than_for_letters() {
    use std::io::BufRead;
    const KEY: &str = "text-cost-key";
    let plugins = plugins_with(&["cpu"], &["supertonic"]);
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("supertonic.toml");
    std::fs::write(
        &profile,
        format!("[backend]\nprefer = [\"cpu\"]\nfallback = false\n[backends.cpu]\nthreads = 1\n[model]\nfiles = [\"{}\"]\n", supertonic_fixture().display()),
    )
    .unwrap();
    let mut child = KillOnDrop(
        std::process::Command::new(tts())
            .args(["serve", "--port", "0", "--api-key", KEY, "--max-input-chars", "10000", "--profile"])
            .arg(&profile)
            .arg("--plugin-dir")
            .arg(plugins.path())
            .env_remove("TTS_LOG")
            .env_remove("TTS_API_KEY")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    let mut lines = std::io::BufReader::new(child.0.stderr.take().unwrap()).lines();
    let first = lines.next().expect("tts serve printed nothing").unwrap();
    let base = first.strip_prefix("listening on ").and_then(|r| r.split_whitespace().next()).unwrap_or_else(|| panic!("first line: {first}")).to_string();
    std::thread::spawn(move || lines.for_each(drop));
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(120))).build().into();
    let started = Instant::now();
    while agent.get(format!("{base}/health")).call().map(|r| r.status().as_u16()).unwrap_or(0) != 200 {
        assert!(started.elapsed() < Duration::from_secs(120), "the model did not load (hang guard)");
        std::thread::sleep(Duration::from_millis(50));
    }
    let speak = |input: &str| {
        let body = serde_json::json!({"model": "supertonic", "voice": "default", "input": input, "response_format": "wav"}).to_string();
        let mut r = agent
            .post(format!("{base}/v1/audio/speech"))
            .header("Authorization", format!("Bearer {KEY}"))
            .header("Content-Type", "application/json")
            .send(body.as_bytes())
            .unwrap();
        let status = r.status().as_u16();
        let bytes = r.body_mut().read_to_vec().unwrap();
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
        bytes.len()
    };
    speak(&"a".repeat(4000));
    let after_letters = vm_hwm_mib(pid).unwrap();
    let marks_audio = speak(&format!("a{}", "\u{301}".repeat(4000)));
    let after_marks = vm_hwm_mib(pid).unwrap();
    drop(child);
    eprintln!("server peak RSS: {after_letters:.1} MiB after 4000 letters, {after_marks:.1} MiB after 4000 marks ({marks_audio} bytes of WAV)");
    assert!(after_marks <= after_letters + 8.0, "the marks raised the server's peak RSS from {after_letters:.1} to {after_marks:.1} MiB");
}
