//! A text chunk streamed as T3 generates: when S3Gen's next block is due,
//! what it adds ([`TokenChunker`]), and where the blocks run
//! ([`BlockRunner`]): between T3's steps, or on a thread and device stream
//! of their own while T3 goes on.

use crate::cloning::Voice;
use crate::model::{stream_cfm_steps, stream_shape, SynthesisParams};
use crate::s3gen::blocks::{BlockStream, StreamShape};
use crate::s3gen::stream::VocoderStream;
use crate::s3gen::S3Gen;
use crate::sampler::Xoshiro256;
use engine_core::model_kit::{Error, Result, Timings};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

/// When the next block is due: after `stream_first_tokens` codes, then
/// every hop, each with the encoder's lookahead after it.
pub(crate) struct BlockDue {
    hop: usize,
    /// Codes the next block needs (its last code, plus the lookahead).
    next: usize,
}

impl BlockDue {
    /// Whether `codes` codes make the next block due; if so, the one after
    /// is a hop later.
    pub(crate) fn take(&mut self, codes: usize) -> bool {
        let due = codes >= self.next;
        if due {
            self.next = codes + self.hop;
        }
        due
    }
}

/// The S3Gen side of token streaming: when a chunk of codes is due, and the
/// mel and audio it adds.
///
/// Each hop is one block of S3Gen's block-causal streaming
/// ([`BlockStream`]): the encoder and the CFM run over the hop's codes only,
/// attending to what earlier blocks left in their caches. The first block is
/// the voice prompt's last `stream_prompt_tokens` codes with the first hop;
/// the CFM sees the prompt's frames and the `stream_context_tokens` codes'
/// frames before a block (0: every frame). A chunk whose codes all arrive
/// before its first hop is due is one block: the one-shot encoder and CFM.
pub(crate) struct TokenChunker {
    lookahead: usize,
    up_stride: usize,
    prompt_token: Vec<i32>,
    prompt_feat: Vec<f32>,
    /// Frames of the whole prompt: the noise draw's frame index of speech frame 0.
    prompt_frames_full: usize,
    spks: Vec<f32>,
    steps: usize,
    z_draws: Xoshiro256,
    /// The utterance's CFM noise, `[frame][mel]`, frame 0 the whole prompt's first.
    z: Vec<f32>,
    /// Created with the first block (a chunk in one block needs none).
    blocks: Option<BlockStream>,
    shape: StreamShape,
    vocoder: VocoderStream,
}

impl TokenChunker {
    /// The chunker of a chunk; `kept` is the last chunk's stream, reused
    /// where its shape is this chunk's.
    pub(crate) fn new(
        s3: &mut S3Gen,
        voice: &Voice,
        params: &SynthesisParams,
        seed: u64,
        hop: usize,
        kept: Option<BlockStream>,
    ) -> Result<(TokenChunker, BlockDue)> {
        let (lookahead, up_stride, mel_ch) = (s3.hp.encoder.pre_lookahead, s3.hp.encoder.up_stride, s3.hp.mel_channels);
        // CosyVoice2 pads its first hop to the hop grid of prompt + speech,
        // which its chunk-causal flow needs; blocks here may be any length,
        // so a short first hop only brings the first audio forward.
        let first = params.stream_first_tokens.clamp(1, hop);
        let (tokens, feat) = (&voice.s3gen.prompt_token, &voice.s3gen.prompt_feat);
        let prompt_frames_full = feat.len() / mel_ch;
        let keep = params.stream_prompt_tokens;
        let (prompt_token, prompt_feat) = if keep == 0 || keep >= tokens.len() {
            (tokens.clone(), feat.clone())
        } else {
            // Dropping prompt codes drops their frames too (a voice may carry
            // more frames than its codes make; those stay, as one-shot keeps them).
            let dropped = tokens.len() - keep;
            let dropped_frames = (dropped * up_stride).min(prompt_frames_full);
            (tokens[dropped..].to_vec(), feat[dropped_frames * mel_ch..].to_vec())
        };
        let steps = stream_cfm_steps(&s3.hp, params);
        let shape = stream_shape(prompt_token.len(), params, first, hop, steps);
        let due = BlockDue { hop, next: first + lookahead };
        let chunker = TokenChunker {
            lookahead,
            up_stride,
            prompt_token,
            prompt_feat,
            prompt_frames_full,
            spks: s3.speaker_projection(&voice.s3gen.embedding)?,
            steps,
            z_draws: Xoshiro256::new(seed ^ 0x5EED_CF31),
            z: Vec::new(),
            blocks: kept.filter(|b| b.shape() == shape).map(BlockStream::restarted),
            shape,
            vocoder: VocoderStream::new(s3, seed ^ 0x50_0C3E),
        };
        Ok((chunker, due))
    }

    /// The stream, for the next chunk of its shape.
    pub(crate) fn into_blocks(self) -> Option<BlockStream> {
        self.blocks
    }

    /// The next block, up to `codes`' end (all of it when `last`, else up to
    /// the lookahead's): its new mel frames through the vocoder.
    pub(crate) fn emit(&mut self, s3: &mut S3Gen, codes: &[i32], last: bool, timings: &mut Timings) -> Result<Vec<f32>> {
        let mel_ch = s3.hp.mel_channels;
        let mut tokens = self.prompt_token.clone();
        tokens.extend_from_slice(codes);
        let end = if last { tokens.len() } else { tokens.len() - self.lookahead };
        let prompt_frames = self.prompt_feat.len() / mel_ch;
        let start = self.blocks.as_ref().map_or(0, BlockStream::tokens_done);
        if end <= start {
            return timings.time("hift", || self.vocoder.push(s3, &[], last));
        }
        let (f0, f1) = (start * self.up_stride, end * self.up_stride);
        if prompt_frames >= f1 && last {
            return Err(format!("the voice's prompt has {prompt_frames} mel frames, the encoder produced only {f1}").into());
        }
        // One draw per utterance: a frame gets the noise one-shot synthesis
        // gives it, wherever the window puts it.
        let noise_of = |f: usize| self.prompt_frames_full - prompt_frames + f;
        if self.z.len() < noise_of(f1) * mel_ch {
            let more = self.z_draws.gaussians(noise_of(f1) * mel_ch - self.z.len());
            self.z.extend(more);
        }
        let z = &self.z[noise_of(f0) * mel_ch..noise_of(f1) * mel_ch];
        let cond: Vec<f32> = (f0 * mel_ch..f1 * mel_ch).map(|i| self.prompt_feat.get(i).copied().unwrap_or(0.0)).collect();
        let x = if start == 0 && last {
            // The whole chunk in one block: the one-shot encoder and CFM.
            let encoded = timings.time("s3gen.encoder", || s3.encode(&tokens))?;
            timings.time("s3gen.cfm", || s3.integrate(z, &encoded.mu, &self.spks, &cond, self.steps))?
        } else {
            if self.blocks.is_none() {
                self.blocks = Some(BlockStream::new(s3, &self.shape)?);
            }
            let blocks = self.blocks.as_mut().expect("made above");
            let encoded = timings.time("s3gen.encoder", || blocks.encode(s3, &tokens, end))?;
            timings.time("s3gen.cfm", || blocks.integrate(s3, z, &encoded.mu, &self.spks, &cond, None))?
        };
        let first = prompt_frames.clamp(f0, f1) - f0;
        timings.time("hift", || self.vocoder.push(s3, &x[first * mel_ch..], last))
    }
}

/// A block to compute: every code so far, and whether they are all.
pub(crate) struct Job {
    codes: Vec<i32>,
    last: bool,
}

/// Where a chunk's blocks run. `Inline`: on the calling thread, between
/// T3's steps (the host, or a device S3Gen shares with T3). `Worker`: on a
/// thread of their own, S3Gen on its own device stream, while T3 goes on;
/// a block's launches and round trips then overlap T3's instead of adding
/// to them. Either way the pieces come out in order, the same samples.
pub(crate) enum BlockRunner<'s> {
    Inline { chunker: Box<TokenChunker>, s3: &'s mut S3Gen, timings: Timings, ready: std::collections::VecDeque<Vec<f32>> },
    Worker { jobs: Option<mpsc::Sender<Job>>, pieces: mpsc::Receiver<Result<Vec<f32>>>, stop: &'s AtomicBool },
}

/// What a worker hands back when its jobs end: the chunker (its stream
/// kept for the next chunk) and its stages' timings.
pub(crate) type WorkerEnd = (TokenChunker, Timings);

impl<'s> BlockRunner<'s> {
    pub(crate) fn inline(chunker: TokenChunker, s3: &'s mut S3Gen) -> Self {
        BlockRunner::Inline { chunker: Box::new(chunker), s3, timings: Timings::default(), ready: Default::default() }
    }

    /// Starts the worker in `scope`; it runs jobs until the sender closes,
    /// a job fails, or `stop` is set.
    pub(crate) fn spawn<'scope>(
        scope: &'scope std::thread::Scope<'scope, '_>,
        mut chunker: TokenChunker,
        s3: &'scope mut S3Gen,
        stop: &'s AtomicBool,
    ) -> Result<(Self, std::thread::ScopedJoinHandle<'scope, WorkerEnd>)>
    where
        's: 'scope,
    {
        let (jobs, job_queue) = mpsc::channel::<Job>();
        let (done, pieces) = mpsc::channel();
        let worker = std::thread::Builder::new()
            .name("s3gen-blocks".into())
            .spawn_scoped(scope, move || {
                let mut timings = Timings::default();
                for job in job_queue {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let piece = chunker.emit(s3, &job.codes, job.last, &mut timings);
                    let failed = piece.is_err();
                    if done.send(piece).is_err() || failed {
                        break;
                    }
                }
                (chunker, timings)
            })
            .map_err(|e| Error::msg(format!("starting S3Gen's block worker: {e}")))?;
        Ok((BlockRunner::Worker { jobs: Some(jobs), pieces, stop }, worker))
    }

    /// Hands on a block (run now inline, queued on a worker).
    pub(crate) fn submit(&mut self, codes: Vec<i32>, last: bool) -> Result<()> {
        match self {
            BlockRunner::Inline { chunker, s3, timings, ready } => {
                ready.push_back(chunker.emit(s3, &codes, last, timings)?);
                Ok(())
            }
            BlockRunner::Worker { jobs, .. } => {
                let sent = jobs.as_ref().is_some_and(|jobs| jobs.send(Job { codes, last }).is_ok());
                // A worker that stopped has sent its error, which `next_piece` reports.
                if !sent {
                    tracing::debug!("the S3Gen block worker has stopped; the block is dropped");
                }
                Ok(())
            }
        }
    }

    /// The next finished piece: None when none is ready (or, with `wait`,
    /// when every block handed on has come back).
    pub(crate) fn next_piece(&mut self, wait: bool) -> Result<Option<Vec<f32>>> {
        match self {
            BlockRunner::Inline { ready, .. } => Ok(ready.pop_front()),
            BlockRunner::Worker { jobs, pieces, .. } => {
                if wait {
                    // No more blocks: the worker ends once its queue is done.
                    jobs.take();
                    pieces.recv().ok().transpose()
                } else {
                    match pieces.try_recv() {
                        Ok(piece) => piece.map(Some),
                        Err(mpsc::TryRecvError::Empty) => Ok(None),
                        Err(mpsc::TryRecvError::Disconnected) => Err(Error::msg("the S3Gen block worker ended early")),
                    }
                }
            }
        }
    }

    /// Stops handing blocks on: a worker skips what it has queued.
    pub(crate) fn stop(&mut self) {
        if let BlockRunner::Worker { jobs, stop, .. } = self {
            stop.store(true, Ordering::Relaxed);
            jobs.take();
        }
    }

    /// The inline runner's chunker and timings (a worker's come from its join).
    pub(crate) fn into_inline_end(self) -> Option<WorkerEnd> {
        match self {
            BlockRunner::Inline { chunker, timings, .. } => Some((*chunker, timings)),
            BlockRunner::Worker { .. } => None,
        }
    }
}
