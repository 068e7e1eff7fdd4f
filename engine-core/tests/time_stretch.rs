//! The pitch-preserving time-stretch behind every family's `speed`
//! (engine_core::audio::stretch): durations of `duration / speed`, the pitch
//! of the input, streaming that joins to the one-shot samples, no clicks.

use engine_core::audio::stretch::{check_speed, stretch, TimeStretch};

const RATE: u32 = 24_000;
const SPEEDS: [f64; 7] = [0.25, 0.5, 0.8, 1.0, 1.25, 2.0, 4.0];

fn tone(seconds: f64, f0: f64) -> Vec<f32> {
    (0..(seconds * RATE as f64) as usize).map(|i| (0.5 * (2.0 * std::f64::consts::PI * f0 * i as f64 / RATE as f64).sin()) as f32).collect()
}

/// A 180 Hz carrier whose loudness swings 4 times a second (a syllable rhythm).
fn am_tone(seconds: f64) -> Vec<f32> {
    let tau = 2.0 * std::f64::consts::PI;
    (0..(seconds * RATE as f64) as usize)
        .map(|i| {
            let t = i as f64 / RATE as f64;
            (0.5 * (0.6 + 0.4 * (tau * 4.0 * t).sin()) * (tau * 180.0 * t).sin()) as f32
        })
        .collect()
}

/// A glide from 150 to 250 Hz, linear in frequency.
fn chirp(seconds: f64) -> Vec<f32> {
    let (f0, f1) = (150.0, 250.0);
    (0..(seconds * RATE as f64) as usize)
        .map(|i| {
            let t = i as f64 / RATE as f64;
            (0.5 * (2.0 * std::f64::consts::PI * (f0 * t + (f1 - f0) * t * t / (2.0 * seconds))).sin()) as f32
        })
        .collect()
}

/// The fundamental of `x[from..to]` from its rising zero crossings
/// (interpolated between samples): crossings per second.
fn f0(x: &[f32], from: usize, to: usize) -> f64 {
    let mut crossings = Vec::new();
    for i in from.max(1)..to.min(x.len()) {
        let (a, b) = (x[i - 1] as f64, x[i] as f64);
        if a < 0.0 && b >= 0.0 {
            crossings.push(i as f64 - 1.0 + a / (a - b));
        }
    }
    assert!(crossings.len() > 10, "too few crossings ({}) in {from}..{to}", crossings.len());
    (crossings.len() - 1) as f64 * RATE as f64 / (crossings[crossings.len() - 1] - crossings[0])
}

/// The steady part of a signal: its middle 80 %.
fn steady(x: &[f32]) -> (usize, usize) {
    (x.len() / 10, x.len() * 9 / 10)
}

fn max_step(x: &[f32]) -> f32 {
    x.windows(2).map(|w| (w[1] - w[0]).abs()).fold(0.0, f32::max)
}

#[test]
fn durations_are_the_input_over_the_speed_and_the_pitch_stays() {
    for (name, input) in [("220 Hz tone", tone(1.5, 220.0)), ("AM tone", am_tone(1.5))] {
        let (a, b) = steady(&input);
        let want_f0 = f0(&input, a, b);
        for speed in SPEEDS {
            let out = stretch(&input, RATE, speed).unwrap();
            let want_len = input.len() as f64 / speed;
            let len_error = (out.len() as f64 - want_len).abs() / want_len;
            let (c, d) = steady(&out);
            let got_f0 = f0(&out, c, d);
            let f0_error = (got_f0 - want_f0).abs() / want_f0;
            let step = max_step(&out) / max_step(&input);
            println!(
                "{name} at {speed}: {} samples for {want_len:.1} ({:.3} %), f0 {got_f0:.3} Hz for {want_f0:.3} ({:.3} %), max step {step:.3}x",
                out.len(),
                len_error * 100.0,
                f0_error * 100.0
            );
            assert!(len_error < 0.02, "{name} at {speed}: {} samples, want {want_len}", out.len());
            assert!(f0_error < 0.01, "{name} at {speed}: f0 {got_f0} Hz, the input's {want_f0} Hz");
            // No click where frames join: no step larger than the input's steepest.
            assert!(step < 1.1, "{name} at {speed}: a step {step} times the input's largest");
        }
    }
}

/// Supertonic's rate (a coarser first search) and low and high voices.
#[test]
fn low_and_high_tones_keep_their_pitch_at_44_1_khz() {
    let rate = 44_100u32;
    for f in [85.0, 120.0, 400.0] {
        let input: Vec<f32> = (0..rate as usize).map(|i| (0.5 * (2.0 * std::f64::consts::PI * f * i as f64 / rate as f64).sin()) as f32).collect();
        let f0_at = |x: &[f32]| {
            let (a, b) = steady(x);
            f0(x, a, b) * rate as f64 / RATE as f64
        };
        let want = f0_at(&input);
        for speed in [0.25, 0.5, 2.0, 4.0] {
            let out = stretch(&input, rate, speed).unwrap();
            assert_eq!(out.len(), (input.len() as f64 / speed).round() as usize);
            let got = f0_at(&out);
            let error = (got - want).abs() / want;
            println!("{f} Hz at 44.1 kHz, speed {speed}: f0 {got:.3} Hz ({:.3} %)", error * 100.0);
            assert!(error < 0.01, "{f} Hz at {speed}: f0 {got}");
            assert!(max_step(&out) < 1.1 * max_step(&input), "{f} Hz at {speed}: a click");
        }
    }
}

#[test]
fn a_glide_keeps_its_pitch_at_each_point_of_its_course() {
    let input = chirp(4.0);
    for speed in [0.25, 0.5, 2.0, 4.0] {
        let out = stretch(&input, RATE, speed).unwrap();
        // The same tenth of the course in the input and the output.
        for tenth in [2, 5, 8] {
            let at = |x: &[f32]| f0(x, x.len() * tenth / 10, x.len() * (tenth + 1) / 10);
            let (want, got) = (at(&input), at(&out));
            let error = (got - want).abs() / want;
            println!("glide at {speed}, tenth {tenth}: {got:.2} Hz for {want:.2} ({:.3} %)", error * 100.0);
            assert!(error < 0.01, "glide at {speed}, tenth {tenth}: {got} Hz, the input's {want} Hz");
        }
        assert!(max_step(&out) < 1.1 * max_step(&input), "glide at {speed}: a click");
    }
}

#[test]
fn streaming_in_pieces_of_any_size_gives_the_one_shot_samples() {
    let input = am_tone(1.2);
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for speed in [0.25, 0.8, 1.25, 4.0] {
        let whole = stretch(&input, RATE, speed).unwrap();
        let mut s = TimeStretch::new(RATE, speed).unwrap();
        let mut joined = Vec::new();
        let mut rest = &input[..];
        let mut pieces = 0;
        while !rest.is_empty() {
            // xorshift: piece sizes from 1 to 2000 samples, some empty.
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let n = ((seed % 2001) as usize).min(rest.len());
            let (piece, after) = rest.split_at(n);
            joined.extend(s.push(piece));
            rest = after;
            pieces += 1;
        }
        joined.extend(s.finish());
        assert!(pieces > 20, "{pieces} pieces");
        assert_eq!(joined.len(), whole.len(), "at {speed}");
        assert!(joined == whole, "at {speed}: streamed samples differ from the one-shot ones");
    }
}

#[test]
fn output_comes_while_input_goes_in() {
    // A stream must not hold everything back until its end.
    let input = tone(2.0, 200.0);
    for speed in [0.25, 4.0] {
        let mut s = TimeStretch::new(RATE, speed).unwrap();
        let mut before_finish = 0;
        for piece in input.chunks(480) {
            before_finish += s.push(piece).len();
        }
        let total = before_finish + s.finish().len();
        assert!(before_finish as f64 > 0.95 * total as f64, "at {speed}: {before_finish} of {total} samples before finish");
    }
}

#[test]
fn bad_speeds_and_rates_are_refused() {
    for bad in [0.2, 4.1, 0.0, -1.0, f64::NAN, f64::INFINITY] {
        let e = TimeStretch::new(RATE, bad).err().unwrap();
        assert_eq!(e, format!("speed must be in 0.25..=4, got {bad}"));
        assert_eq!(check_speed(bad).unwrap_err(), e);
    }
    assert!(check_speed(0.25).is_ok() && check_speed(4.0).is_ok());
    assert_eq!(TimeStretch::new(0, 1.5).err().unwrap(), "cannot time-stretch audio at 0 Hz");
}
