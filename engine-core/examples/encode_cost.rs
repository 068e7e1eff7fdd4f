//! What each output format's encoder costs: the time to start an encoder and
//! encode a first piece of 100 ms, and to encode one second of audio, at
//! Supertonic's 44.1 kHz and Chatterbox's 24 kHz (best of 5 runs each).
//! Figures in docs/performance.md ("Output encoders").
//!
//!     cargo run --release -p engine-core --example encode_cost

use engine_core::audio::encode::{AudioFormat, StreamEncoder};
use std::time::Instant;

fn best_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1000.0
        })
        .fold(f64::MAX, f64::min)
}

fn main() {
    println!("| rate | format | start + first 100 ms piece, ms | one second of audio, ms |");
    println!("|---|---|---|---|");
    for rate in [44_100u32, 24_000] {
        let second: Vec<f32> = (0..rate as usize).map(|i| 0.3 * (i as f32 * 440.0 * std::f32::consts::TAU / rate as f32).sin()).collect();
        for format in AudioFormat::ALL {
            let first = best_ms(5, || {
                let mut e = StreamEncoder::new(format, rate).expect("encoder");
                e.push(&second[..rate as usize / 10], &mut Vec::new()).expect("encoding");
            });
            // An encoder already started, as for every piece after the first.
            let mut e = StreamEncoder::new(format, rate).expect("encoder");
            let whole = best_ms(5, || e.push(&second, &mut Vec::new()).expect("encoding"));
            println!("| {rate} | {} | {first:.2} | {whole:.2} |", format.name());
        }
    }
}
