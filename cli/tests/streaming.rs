//! Streaming through the plugin ABI with the tone fixture plugin: pieces in
//! order, cancellation by the receiver, and a plugin built against ABI 5.1
//! (before streaming existed) answering with one piece of the same audio.

mod common;

use common::{artifacts, old_abi_tone_plugin, tone_setup, write_profile};
use engine_core::engine::{Engine, EngineError, ModelSession};
use engine_core::profile::Profile;
use std::path::Path;

/// The tone model on the CPU, with the plugin file `tone_plugin` installed as
/// the tone family's plugin.
fn tone_session(tone_plugin: &Path, dir: &Path) -> ModelSession {
    let (plugins, gguf) = tone_setup(&["cpu"]);
    std::fs::copy(tone_plugin, plugins.path().join("libtts_model_tone.so")).unwrap();
    let profile = write_profile(dir, &format!("[backend]\nprefer = [\"cpu\"]\nfallback = false\n[model]\nfiles = [\"{}\"]\n", gguf.display()));
    let engine = Engine::open(Profile::load(&profile).unwrap(), vec![plugins.path().to_path_buf()]).unwrap();
    let session = engine.open_model(&[]).unwrap();
    // The plugin files stay loaded for the process; the directory may go.
    drop(plugins);
    session
}

/// Every piece of one streamed synthesis of `text`, and how it ended.
fn pieces(session: &mut ModelSession, text: &str, stop_after: Option<usize>) -> (Vec<Vec<f32>>, engine_core::abi::StreamSummary) {
    let mut got: Vec<Vec<f32>> = Vec::new();
    let summary = session
        .synthesize_streaming(text, |samples, _| {
            got.push(samples.to_vec());
            Ok(stop_after.is_none_or(|n| got.len() < n))
        })
        .unwrap();
    (got, summary)
}

#[test]
fn pieces_arrive_in_order_and_join_to_the_one_shot_audio() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = tone_session(&artifacts().join("libtts_test_tone.so"), dir.path());
    let whole = session.synthesize("hello").unwrap();
    let (got, summary) = pieces(&mut session, "hello", None);
    assert_eq!(got.iter().map(Vec::len).collect::<Vec<_>>(), vec![1600; 5], "one piece per character");
    assert_eq!(got.concat(), whole.samples.to_vec(), "streamed and one-shot audio are the same samples");
    assert_eq!((summary.pieces, summary.samples, summary.cancelled, summary.sample_rate), (5, 8000, false, 16000));
}

#[test]
fn the_receiver_can_stop_a_synthesis() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = tone_session(&artifacts().join("libtts_test_tone.so"), dir.path());
    let (got, summary) = pieces(&mut session, "hello", Some(2));
    assert_eq!(got.len(), 2);
    assert!(summary.cancelled && summary.pieces == 2, "{summary:?}");
    // An error from the receiver stops the synthesis and is what the caller gets.
    let e = session.synthesize_streaming("hello", |_, _| Err(EngineError("the listener went away".into()))).unwrap_err();
    assert_eq!(e.0, "the listener went away");
    // A receiver that panics ends the synthesis with an error, not an abort.
    let e = session.synthesize_streaming("hello", |_, _| panic!("receiver bug")).unwrap_err();
    assert!(e.0.contains("the audio receiver panicked"), "{}", e.0);
    // The session still works afterwards.
    assert_eq!(pieces(&mut session, "hi", None).0.len(), 2);
}

/// `cargo xtask test` builds the tone plugin against ABI 5.1 (its root module
/// and model trait of then, `--features abi-5-1`) into `target/abi-5-1/`; a
/// plain `cargo test` without it says so and skips.
#[test]
fn a_plugin_built_against_abi_5_1_loads_and_streams_one_piece() {
    let Some(old_plugin) = old_abi_tone_plugin("5.1") else {
        return;
    };
    // abi_stable refuses it through the current interface; the loader takes it through 5.1's.
    let (loaded, _) = engine_core::loader::load_model(&old_plugin).unwrap();
    assert_eq!(loaded.abi_version(), "5.1.0");
    let (current, _) = engine_core::loader::load_model(&artifacts().join("libtts_test_tone.so")).unwrap();
    assert_eq!(current.abi_version(), engine_core::PLUGIN_ABI_VERSION);
    let dir = tempfile::tempdir().unwrap();
    let mut old = tone_session(&old_plugin, dir.path());
    let (got, summary) = pieces(&mut old, "hello", None);
    assert_eq!((got.len(), summary.pieces, summary.samples), (1, 1, 8000), "the whole synthesis as one piece");
    let dir = tempfile::tempdir().unwrap();
    let mut new = tone_session(&artifacts().join("libtts_test_tone.so"), dir.path());
    assert_eq!(got.concat(), pieces(&mut new, "hello", None).0.concat(), "the same audio as the current build's pieces");
    // A 5.1 plugin lists nothing it could not say then.
    assert_eq!((old.catalog().voices.len(), old.catalog().languages.len(), old.catalog().clones_voices), (0, 0, false));
    // Cancelling after the one piece is still reported.
    let (_, summary) = pieces(&mut old, "hello", Some(1));
    assert!(summary.cancelled, "{summary:?}");
}

/// A model session on the committed tiny fixture `files`, CPU, one thread.
fn fixture_session(files: &[std::path::PathBuf], families: &[&str], dir: &Path, overrides: &[(String, String)]) -> ModelSession {
    let plugins = common::plugins_with(&["cpu"], families);
    let profile = common::profile_on(dir, "cpu", files);
    let engine = Engine::open(Profile::load(&profile).unwrap(), vec![plugins.path().to_path_buf()]).unwrap();
    let session = engine.open_model(overrides).unwrap();
    drop(plugins);
    session
}

/// Pieces of `text` streamed through `session` with the options `set`,
/// against its one-shot synthesis.
fn streamed_against_one_shot(session: &mut ModelSession, text: &str, set: &[(String, String)]) -> usize {
    let whole = session.synthesize(text).unwrap();
    let mut pieces: Vec<Vec<f32>> = Vec::new();
    let summary = session
        .synthesize_streaming_with(text, set, |p, rate| {
            assert_eq!(rate, whole.sample_rate);
            pieces.push(p.to_vec());
            Ok(true)
        })
        .unwrap();
    assert_eq!(pieces.concat(), whole.samples.to_vec(), "the pieces join to the one-shot samples");
    assert_eq!((summary.pieces as usize, summary.samples as usize, summary.cancelled), (pieces.len(), whole.samples.len(), false));
    pieces.len()
}

#[test]
fn supertonic_streams_one_piece_per_text_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = fixture_session(&[common::supertonic_fixture()], &["supertonic"], dir.path(), &[]);
    let long = "The quick brown fox jumps over the lazy dog near the river bank today. ".repeat(6);
    let official = [("stream_first_chars".to_string(), "0".to_string())];
    let n = streamed_against_one_shot(&mut session, &long, &official);
    assert!(n >= 2, "{} characters in {n} piece(s)", long.len());
    assert_eq!(streamed_against_one_shot(&mut session, "Hello.", &[]), 1, "a first chunk within stream_first_chars is not cut");
    eprintln!("supertonic: {} characters streamed in {n} pieces, identical to one-shot", long.len());
    // Stopping after the first chunk skips the rest.
    let (got, summary) = pieces(&mut session, &long, Some(1));
    assert!(summary.cancelled && got.len() == 1, "{summary:?}");
}

/// The streamed first chunk is cut at `stream_first_chars`: its piece is the
/// one-shot synthesis of the head alone, the rest follows after a clause's pause.
#[test]
fn supertonic_cuts_a_long_first_chunk_when_streaming() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = fixture_session(&[common::supertonic_fixture()], &["supertonic"], dir.path(), &[]);
    let text = "When the lights went out in the old hall, everyone stayed calm and waited.";
    let at = |n: usize| [("stream_first_chars".to_string(), n.to_string())];
    let mut cut: Vec<Vec<f32>> = Vec::new();
    session
        .synthesize_streaming_with(text, &at(45), |p, _| {
            cut.push(p.to_vec());
            Ok(true)
        })
        .unwrap();
    assert_eq!(cut.len(), 2, "the head, then the rest");
    // One-shot, the head is the last chunk and cut to its duration; streamed,
    // the vocoder's whole output goes out with it.
    let head = session.synthesize("When the lights went out in the old hall,").unwrap();
    assert!(cut[0].starts_with(&head.samples), "the first piece speaks the head alone ({} samples, {} one-shot)", cut[0].len(), head.samples.len());
    let pause = head.sample_rate as usize / 10;
    assert!(cut[1].len() > pause && cut[1][..pause].iter().all(|&v| v == 0.0), "a 0.1 s pause opens the second piece");
    assert!(cut[1][pause..].iter().any(|&v| v != 0.0));
    let whole = session.synthesize(text).unwrap();
    eprintln!("supertonic tiny: first piece {} samples cut at 45 characters, against {} for the whole sentence", cut[0].len(), whole.samples.len());
    // Without spaces or marks within the limit there is nothing to cut at.
    let mut one: Vec<Vec<f32>> = Vec::new();
    session
        .synthesize_streaming_with("Supercalifragilisticexpialidocious was the word.", &at(10), |p, _| {
            one.push(p.to_vec());
            Ok(true)
        })
        .unwrap();
    assert_eq!(one.len(), 1);
}

#[test]
fn chatterbox_streams_one_piece_per_text_chunk_with_the_crossfade_held_back() {
    let dir = tempfile::tempdir().unwrap();
    let overrides =
        [("max_chars".to_string(), "30".to_string()), ("max_new_tokens".to_string(), "12".to_string()), ("stream_tokens".to_string(), "0".to_string())];
    let mut session = fixture_session(&common::chatterbox_fixture(), &["chatterbox"], dir.path(), &overrides);
    let n = streamed_against_one_shot(&mut session, "First sentence here. Then a second one. And a third.", &[]);
    assert!(n >= 3, "{n} pieces");
    eprintln!("chatterbox: 3 text chunks streamed in {n} pieces (the last the crossfade tail), identical to one-shot");
}

/// Log-mel spectrogram of `x` at `rate` (1024-point Hann frames, hop 256,
/// 80 triangular bands from 0 to Nyquist on the mel scale, log10 of power + 1e-5).
fn log_mel(x: &[f32], rate: u32) -> Vec<f64> {
    let (n, hop, bands) = (1024usize, 256usize, 80usize);
    let mut planner = realfft::RealFftPlanner::<f64>::new();
    let fft = planner.plan_fft_forward(n);
    let mel = |hz: f64| 2595.0 * (1.0 + hz / 700.0).log10();
    let top = mel(rate as f64 / 2.0);
    let edges: Vec<f64> = (0..bands + 2).map(|i| 700.0 * (10f64.powf(top * i as f64 / (bands + 1) as f64 / 2595.0) - 1.0)).collect();
    let bin_hz = rate as f64 / n as f64;
    let mut out = Vec::new();
    let mut frame = fft.make_input_vec();
    let mut spectrum = fft.make_output_vec();
    for start in (0..x.len().saturating_sub(n)).step_by(hop) {
        for (i, f) in frame.iter_mut().enumerate() {
            let w = 0.5 - 0.5 * (std::f64::consts::TAU * i as f64 / n as f64).cos();
            *f = x[start + i] as f64 * w;
        }
        fft.process(&mut frame, &mut spectrum).unwrap();
        for b in 0..bands {
            let (lo, mid, hi) = (edges[b], edges[b + 1], edges[b + 2]);
            let power: f64 = spectrum
                .iter()
                .enumerate()
                .map(|(k, c)| {
                    let hz = k as f64 * bin_hz;
                    let w = if hz <= lo || hz >= hi {
                        0.0
                    } else if hz <= mid {
                        (hz - lo) / (mid - lo)
                    } else {
                        (hi - hz) / (hi - mid)
                    };
                    w * c.norm_sqr()
                })
                .sum();
            out.push((power + 1e-5).log10());
        }
    }
    out
}

/// Streams `text` with the options `set`; every piece.
fn streamed_pieces(session: &mut ModelSession, text: &str, set: &[(&str, String)]) -> Vec<Vec<f32>> {
    let set: Vec<(String, String)> = set.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    let mut pieces: Vec<Vec<f32>> = Vec::new();
    let summary = session
        .synthesize_streaming_with(text, &set, |p, _| {
            pieces.push(p.to_vec());
            Ok(true)
        })
        .unwrap();
    assert!(!summary.cancelled && pieces.iter().flatten().all(|v| v.is_finite()));
    pieces
}

/// Log-mel cosine and SNR of `streamed` against `whole`.
fn likeness(streamed: &[f32], whole: &[f32], rate: u32) -> (f64, f64) {
    let (a, b) = (log_mel(streamed, rate), log_mel(whole, rate));
    let dot: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
    let cosine = dot / (a.iter().map(|x| x * x).sum::<f64>().sqrt() * b.iter().map(|x| x * x).sum::<f64>().sqrt());
    (cosine, engine_core::compare::snr_db(streamed, whole).unwrap())
}

#[test]
fn chatterbox_streams_speech_tokens_in_hops_close_to_one_shot() {
    let dir = tempfile::tempdir().unwrap();
    let overrides = [("max_new_tokens".to_string(), "60".to_string()), ("min_new_tokens".to_string(), "60".to_string())];
    let mut session = fixture_session(&common::chatterbox_fixture(), &["chatterbox"], dir.path(), &overrides);
    let text = "Streaming starts before the speech tokens end.";
    let whole = session.synthesize(text).unwrap();
    let rate = whole.sample_rate;
    // The one-shot decoder's step count (Turbo's 2): streaming defaults to 1.
    let exact = |hop: usize| vec![("stream_tokens", hop.to_string()), ("stream_first_tokens", hop.max(1).to_string()), ("stream_cfm_steps", "2".to_string())];
    let per_chunk = streamed_pieces(&mut session, text, &exact(0));
    assert_eq!(per_chunk.concat(), whole.samples.to_vec(), "per text chunk: the one-shot samples");
    // No hop falls due before T3 stops: the stream's one window (its noise
    // streams, frame-indexed draws, continued source) gives the one-shot samples.
    let one_window = streamed_pieces(&mut session, text, &exact(100));
    assert_eq!(one_window.len(), 2, "the window, then the crossfade tail held for a next chunk");
    assert_eq!(one_window.concat(), whole.samples.to_vec(), "one window: the one-shot samples");

    for hop in [8usize, 20] {
        let set = [("stream_tokens", hop.to_string()), ("stream_first_tokens", hop.min(10).to_string())];
        let pieces = streamed_pieces(&mut session, text, &set);
        let streamed = pieces.concat();
        assert_eq!(streamed.len(), whole.samples.len(), "hop {hop}: every mel frame vocoded once");
        // 60 tokens: a first hop (10, or `hop` if shorter), then one per `hop` codes, then the rest.
        assert!(pieces.len() >= 60 / hop, "hop {hop}: {} pieces", pieces.len());
        let (cosine, snr) = likeness(&streamed, &whole.samples, rate);
        eprintln!("chatterbox tiny, 60 tokens, hop {hop}, defaults: {} pieces; against one-shot: log-mel cosine {cosine:.4}, SNR {snr:.1} dB", pieces.len());
        assert!(cosine > 0.9, "hop {hop}: log-mel cosine {cosine}");
    }
}

/// The context window: hops whose window still holds every earlier code give
/// the samples of a stream without a window; later hops differ, yet stay close.
/// A prompt window shorter than the voice's prompt changes the audio too.
#[test]
fn chatterbox_streaming_windows_bound_what_each_hop_sees() {
    let dir = tempfile::tempdir().unwrap();
    let overrides = [("max_new_tokens".to_string(), "60".to_string()), ("min_new_tokens".to_string(), "60".to_string())];
    let mut session = fixture_session(&common::chatterbox_fixture(), &["chatterbox"], dir.path(), &overrides);
    let text = "Streaming starts before the speech tokens end.";
    let rate = session.synthesize(text).unwrap().sample_rate;
    let with = |context: usize, prompt: usize| {
        vec![
            ("stream_tokens", "8".to_string()),
            ("stream_first_tokens", "8".to_string()),
            ("stream_context_tokens", context.to_string()),
            ("stream_prompt_tokens", prompt.to_string()),
        ]
    };
    let unbounded = streamed_pieces(&mut session, text, &with(0, 0));
    let bounded = streamed_pieces(&mut session, text, &with(12, 0));
    assert_eq!(bounded.len(), unbounded.len());
    // Hops at 8 + 3 lookahead codes, then every 8: the window first drops a
    // code at the hop after 12 codes were vocoded (the third).
    assert_eq!(bounded[..2], unbounded[..2], "hops that see every code");
    assert_ne!(bounded[2], unbounded[2], "the third hop sees 12 earlier codes, not 16");
    let (cosine, snr) = likeness(&bounded.concat(), &unbounded.concat(), rate);
    eprintln!("chatterbox tiny, hop 8: a 12-code context against every code: log-mel cosine {cosine:.4}, SNR {snr:.1} dB");
    assert!(cosine > 0.9, "context window: log-mel cosine {cosine}");

    // The fixture's prompt has 6 codes: 6 or more is the whole prompt.
    assert_eq!(streamed_pieces(&mut session, text, &with(12, 6)), bounded);
    let short_prompt = streamed_pieces(&mut session, text, &with(12, 3)).concat();
    assert_ne!(short_prompt, bounded.concat(), "half the prompt conditions the decoder differently");
    let (cosine, snr) = likeness(&short_prompt, &bounded.concat(), rate);
    eprintln!("chatterbox tiny, hop 8: half the voice prompt against all of it: log-mel cosine {cosine:.4}, SNR {snr:.1} dB");
    assert!(cosine > 0.8, "prompt window: log-mel cosine {cosine}");
}

/// A progress report as the engine hands it on: unit, count, bound.
type Report = (String, u64, Option<u64>);

/// Every progress report and piece of one synthesis of `text` with `set`,
/// stopping at the first report whose count reaches `stop_at`.
fn observed(session: &mut ModelSession, text: &str, set: &[(&str, &str)], stop_at: Option<u64>) -> (Vec<Report>, Vec<usize>, engine_core::abi::StreamSummary) {
    let set: Vec<(String, String)> = set.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let (mut reports, mut pieces) = (Vec::new(), Vec::new());
    let summary = session
        .synthesize_observed(
            text,
            &set,
            |samples, _| {
                pieces.push(samples.len());
                Ok(true)
            },
            |p| {
                reports.push((p.unit.to_string(), p.done, p.limit));
                stop_at.is_none_or(|n| p.done < n)
            },
        )
        .unwrap();
    (reports, pieces, summary)
}

/// Chatterbox reports each speech token T3 generates, counted from 1 within
/// each text chunk and ending at that chunk's token count, in one-shot pieces
/// and in token hops alike; a progress receiver that says stop ends the
/// synthesis inside T3, before any audio of the chunk.
#[test]
fn chatterbox_reports_each_speech_token_and_a_report_can_stop_it() {
    let dir = tempfile::tempdir().unwrap();
    let overrides = [("max_chars".to_string(), "30".to_string()), ("max_new_tokens".to_string(), "14".to_string())];
    let mut session = fixture_session(&common::chatterbox_fixture(), &["chatterbox"], dir.path(), &overrides);
    let text = "First sentence here. Then a second one.";
    for hop in ["0", "5"] {
        let (reports, pieces, summary) = observed(&mut session, text, &[("stream_tokens", hop)], None);
        assert!(reports.iter().all(|r| r.0 == "speech tokens" && r.2 == Some(14)), "hop {hop}: {reports:?}");
        // Each chunk's count runs 1, 2, …, n; the counts of the two chunks sum to every speech token.
        let chunk_counts: Vec<u64> =
            reports.iter().enumerate().filter(|(i, r)| reports.get(i + 1).is_none_or(|next| next.1 == 1) && r.1 > 0).map(|(_, r)| r.1).collect();
        let expected: Vec<u64> = chunk_counts.iter().flat_map(|n| 1..=*n).collect();
        assert_eq!(reports.iter().map(|r| r.1).collect::<Vec<_>>(), expected, "hop {hop}");
        assert_eq!(chunk_counts.len(), 2, "hop {hop}: two text chunks");
        let speech_tokens = summary.tokens.iter().find(|t| t.name.as_str() == "speech_tokens").unwrap().tokens.len() as u64;
        assert_eq!(chunk_counts.iter().sum::<u64>(), speech_tokens, "hop {hop}");
        assert!(!summary.cancelled && !pieces.is_empty(), "hop {hop}");
    }
    let (reports, pieces, summary) = observed(&mut session, text, &[("stream_tokens", "0")], Some(3));
    assert_eq!(reports.iter().map(|r| r.1).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert!(summary.cancelled && pieces.is_empty() && summary.pieces == 0, "{summary:?}, {pieces:?}");
    let (_, pieces, summary) = observed(&mut session, text, &[("stream_tokens", "5")], Some(9));
    assert!(summary.cancelled && pieces.len() == 1, "one hop of 5 tokens came before the stop at 9: {pieces:?}");
}

/// `cargo xtask test` builds the tone plugin against ABI 5.4 (its root module
/// of then, `--features abi-5-4`) into `target/abi-5-4/`: the loader takes it
/// through 5.4's interface; its model, which has no `synthesize_with_progress`,
/// streams as before and reports no progress.
#[test]
fn a_plugin_built_against_abi_5_4_streams_without_progress() {
    let Some(old_plugin) = old_abi_tone_plugin("5.4") else {
        return;
    };
    let (loaded, _) = engine_core::loader::load_model(&old_plugin).unwrap();
    assert_eq!(loaded.abi_version(), "5.4.0");
    assert!(loaded.converter().is_some(), "5.4 had converters");
    let dir = tempfile::tempdir().unwrap();
    let mut old = tone_session(&old_plugin, dir.path());
    let (reports, pieces, summary) = observed(&mut old, "hello", &[], None);
    assert_eq!((reports.len(), pieces, summary.pieces), (0, vec![1600; 5], 5));
    let dir = tempfile::tempdir().unwrap();
    let mut new = tone_session(&artifacts().join("libtts_test_tone.so"), dir.path());
    assert_eq!(self::pieces(&mut old, "hello", None).0.concat(), self::pieces(&mut new, "hello", None).0.concat());
}
