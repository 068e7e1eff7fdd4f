#!/usr/bin/env python3
"""Block-causal streaming reference for S3Gen's flow (encoder + CFM decoder), from the official
modules of the installed reference package (chatterbox-tts 0.1.7).

The speech tokens of a committed tiny fixture are split into blocks over `prompt ++ speech`
(N tokens): the first block holds the whole prompt and `--first` speech tokens, each later one
`--hop` tokens, the last what is left. The official flow then runs unchanged except for
`add_optional_chunk_mask`, replaced in the encoder's and the decoder's module namespaces by one
that also forbids attention to later blocks: a token in block k (and its `token_mel_ratio` mel
frames) attends only to tokens (frames) of blocks <= k. Convolutions are left as they are, so
the encoder's pre-lookahead still reads `pre_lookahead_len` following tokens. This is the
computation a streaming engine reproduces by running the blocks one after another with each
attention layer's keys and values carried over.

With `--window W` the CFM decoder's mask (and only that one: the encoder keeps the plain block
mask) is narrowed further to a sink plus a window. With S = token_mel_ratio * P the prompt's
frames, a frame of the block covering frames [a_k, b_k) attends to frame j iff j < b_k and
(j < S or j >= max(S, a_k - W)): the prompt's frames always, the W frames before the block's
start, and the block itself. The window hangs off the block's start, not the query frame, so all
frames of a block see the same keys; that is what a streaming decoder keeping a bounded cache of
W frames (after the prompt's) computes. The files then go to reference/stream-window/ instead.

Writes DIR/reference/stream/*.npy and stream_stages.json, after self-checks: unpatched, the
fixture's own s3gen_* dumps come back (within 1e-4: they may come from another CPU); the patched
mask equals one spelled out position by position; one block covering everything gives the
unpatched result bit for bit; changing the speech tokens from e_k + pre_lookahead_len on leaves
every output frame before token_mel_ratio * e_k bit-identical and changes a later one (at these
blocks' boundaries and at every boundary of one block per speech token); more than one block
changes the result. With a window, also: the decoder's mask equals a sink-plus-window mask
spelled out position by position; a window wider than the sequence gives the block run without a
window bit for bit; the chosen window leaves encoder_out, mu and every frame before the first
block that loses keys bit-identical to that run and changes a later frame of each decoder output.

    target/chatterbox-venv/bin/python tools/chatterbox/stream_reference.py \
        --fixture tests/fixtures/chatterbox/turbo-tiny --variant turbo --first 3 --hop 3
    target/chatterbox-venv/bin/python tools/chatterbox/stream_reference.py \
        --fixture tests/fixtures/chatterbox/mtl-tiny --variant mtl
    target/chatterbox-venv/bin/python tools/chatterbox/stream_reference.py \
        --fixture tests/fixtures/chatterbox/turbo-tiny --variant turbo --first 3 --hop 3 --window 6
"""
import argparse
import copy
import json
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402  (S3Gen construction at the fixture sizes, dump helpers)
import make_mtl_fixtures as mtlf  # noqa: E402

import chatterbox.models.s3gen.decoder as decoder_mod  # noqa: E402
import chatterbox.models.s3gen.transformer.upsample_encoder as upenc_mod  # noqa: E402
from chatterbox.models.s3gen.s3gen import S3Token2Mel  # noqa: E402
from chatterbox.mtl_tts import Conditionals as MtlConditionals  # noqa: E402
from chatterbox.tts_turbo import Conditionals as TurboConditionals  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

# Per variant: the official checkpoint file, how it loads, the sizes it was built at, the CFM.
VARIANTS = {
    "turbo": dict(checkpoint="s3gen_meanflow.safetensors", meanflow=True, sizes=mf.SIZES,
                  conditionals=TurboConditionals, n_timesteps=2, module="S3Gen(meanflow=True)"),
    "mtl": dict(checkpoint="s3gen.pt", meanflow=False, sizes=mtlf.SIZES,
                conditionals=MtlConditionals, n_timesteps=10, module="S3Gen (standard)"),
}


def block_ends(prompt_len, n_speech, first, hop):
    """Token ends (exclusive) of the blocks over prompt ++ speech; the last equals N."""
    if first < 1 or hop < 1:
        raise ValueError("--first and --hop must be at least 1")
    ends, e = [], prompt_len + min(first, n_speech)
    ends.append(e)
    while e < prompt_len + n_speech:
        e = min(e + hop, prompt_len + n_speech)
        ends.append(e)
    return ends


def block_causal(original, token_ends, ratio, seen, window=None):
    """`add_optional_chunk_mask` that returns the official mask AND'ed with the block mask.
    The attention length tells which rate the caller works at: N (the encoder's first stack) or
    ratio * N (the encoder's up stack and every CFM transformer block).
    `window` = (S, W) narrows it further (frame rate only, for the decoder): a frame of the block
    [a, b) keeps only the keys j < S (the prompt's frames) and max(S, a - W) <= j < b."""
    ends = torch.tensor(token_ends, dtype=torch.int64)
    n = int(ends[-1])

    def add_optional_chunk_mask(xs, masks, *args, **kwargs):
        base = original(xs, masks, *args, **kwargs)
        length = masks.size(-1)
        if length == n:
            frame_ends, rate = ends, "token"
        elif length == ratio * n:
            frame_ends, rate = ends * ratio, "frame"
        else:
            raise RuntimeError("attention over %d positions: neither N=%d tokens nor %d frames"
                               % (length, n, ratio * n))
        pos = torch.arange(length)
        block = torch.searchsorted(frame_ends, pos, right=True)  # i's block
        end_of = frame_ends[block]  # end of i's block
        allowed = pos[None, :] < end_of[:, None]  # [i, j]: j before the end of i's block
        if window is not None:
            if rate != "frame":
                raise RuntimeError("a decoder window at the token rate (%d positions)" % length)
            sink, frames = window
            start_of = torch.cat([torch.zeros(1, dtype=torch.int64), frame_ends])[block]  # a of i's block
            low = torch.clamp(start_of - frames, min=sink)  # first non-sink key i still sees
            allowed &= (pos[None, :] < sink) | (pos[None, :] >= low[:, None])
        seen.append((rate, tuple(base.shape), base.dtype))
        return base & allowed[None]

    return add_optional_chunk_mask


@contextmanager
def mask_patch(token_ends, ratio, seen, window=None):
    """Swaps add_optional_chunk_mask where the encoder and the decoder look it up; `window`
    (S, W), if any, narrows the decoder's only."""
    if token_ends is None:
        assert window is None, "a decoder window without blocks"
        yield
        return
    with mf.patched(upenc_mod, "add_optional_chunk_mask",
                    block_causal(upenc_mod.add_optional_chunk_mask, token_ends, ratio, seen)), \
         mf.patched(decoder_mod, "add_optional_chunk_mask",
                    block_causal(decoder_mod.add_optional_chunk_mask, token_ends, ratio, seen, window)):
        yield


@contextmanager
def inject_z(z):
    """The CFM's one `torch.randn_like(mu)` returns `z` instead (and only once)."""
    real = torch.randn_like
    calls = []

    def randn_like(t, *a, **k):
        assert not calls, "a second torch.randn_like inside the flow"
        assert t.shape == z.shape, (t.shape, z.shape)
        calls.append(1)
        return z.clone()

    torch.randn_like = randn_like
    try:
        yield
    finally:
        torch.randn_like = real
    assert calls, "the CFM drew no noise"


def run_flow(s3gen, gen, speech, z, n_timesteps, token_ends=None, window=None):
    """S3Token2Mel.forward (finalize=True, noised_mels=None: the CFM's noise is exactly `z`),
    with the block mask when `token_ends` is given (and the decoder's narrowed to `window`
    (S, W) when that is given). Returns the encoder output, mu, the
    estimator calls, the returned mel and what the patched mask function saw."""
    flow = s3gen.flow
    rec, seen, calls = {}, [], []
    hooks = [flow.encoder.register_forward_hook(lambda m, i, o: rec.__setitem__("enc", o[0].clone())),
             flow.encoder_proj.register_forward_hook(lambda m, i, o: rec.__setitem__("mu", o.clone()))]
    est = flow.decoder.estimator
    est_forward = type(est).forward

    def est_wrap(x, mask, mu, t, spks=None, cond=None, r=None):
        v = est_forward(est, x, mask, mu, t, spks=spks, cond=cond, r=r)
        calls.append(dict(x=x.clone(), t=t.clone(), r=None if r is None else r.clone(),
                          spks=spks.clone(), cond=cond.clone(), v=v.clone()))
        return v
    est.forward = est_wrap
    try:
        with mask_patch(token_ends, flow.token_mel_ratio, seen, window), inject_z(z):
            mel = S3Token2Mel.forward(s3gen, speech[None], ref_wav=None, ref_sr=None,
                                      ref_dict=copy.deepcopy(gen), n_cfm_timesteps=n_timesteps,
                                      finalize=True, noised_mels=None)
    finally:
        for h in hooks:
            h.remove()
        del est.forward
    assert len(calls) == n_timesteps, len(calls)
    return dict(enc=rec["enc"], mu=rec["mu"], calls=calls, mel=mel.clone(), seen=seen)


def t_span(n_timesteps, meanflow, cfm):
    """The time grid CausalConditionalCFM.forward builds (float32)."""
    t = torch.linspace(0, 1, n_timesteps + 1, dtype=torch.float32)
    if not meanflow and cfm.t_scheduler == "cosine":
        t = 1 - torch.cos(t * 0.5 * torch.pi)
    return t


def outputs(res, meanflow, cfm, n_timesteps):
    """Named per-frame outputs: (name, tensor, frame axis); frames of the whole prompt ++ speech.
    The final mel is recomputed from the last step exactly as the solver does it."""
    calls = res["calls"]
    ts = t_span(n_timesteps, meanflow, cfm)
    out = [("encoder_out", res["enc"], 1), ("mu", res["mu"], 1)]
    for i, c in enumerate(calls):
        assert torch.equal(c["t"].reshape(-1)[0], ts[i]), (i, c["t"], ts[i])
        out.append((f"cfm_step{i}_x", c["x"][:1], 2))
        out.append((f"cfm_step{i}_v", c["v"], 2))
    c = calls[-1]
    t, r = ts[-2:-1], ts[-1:]
    if meanflow:
        mel = c["x"] + (r - t) * c["v"]
    else:  # solve_euler: the conditional row and the unconditioned row, combined
        v, v_unc = torch.split(c["v"], [1, 1], dim=0)
        mel = c["x"][:1] + (r - t) * ((1.0 + cfm.inference_cfg_rate) * v - cfm.inference_cfg_rate * v_unc)
    prompt_frames = mel.shape[2] - res["mel"].shape[2]
    assert torch.equal(mel[:, :, prompt_frames:], res["mel"]), "final mel recomputation differs"
    out.append(("mel", mel, 2))
    return out


def equal_all(a, b):
    return [name for (name, x, _), (_, y, _) in zip(a, b) if not torch.equal(x, y)]


def window_blocks(token_ends, ratio, sink, frames):
    """Per block: its frames [a, b), the keys its frames see and those the window takes away."""
    rows, a = [], 0
    for e in token_ends:
        b = ratio * e
        low = max(sink, a - frames)
        rows.append(dict(frames=[a, b], keys_seen=[[0, sink], [low, b]] if low > sink else [[0, b]],
                         keys_excluded=[sink, low] if low > sink else None))
        a = b
    return rows


def check_window(s3gen, gen, speech, z, n_steps, ends, ratio, N, window, stream, meanflow, cfm):
    """The window's self-checks (see the module doc); returns what stream_stages.json records."""
    sink, frames = window
    # The decoder's mask against one spelled out position by position, at the frame rate.
    probe = block_causal(lambda xs, masks, *a, **k: masks, ends, ratio, [], window)
    L = ratio * N
    frame_ends = [ratio * e for e in ends]
    want = torch.zeros(L, L, dtype=torch.bool)
    for i in range(L):
        k = next(k for k, b in enumerate(frame_ends) if i < b)
        a, b = (frame_ends[k - 1] if k else 0), frame_ends[k]
        for j in range(L):
            want[i, j] = j < b and (j < sink or j >= max(sink, a - frames))
    assert torch.equal(probe(torch.zeros(1, L, 1), torch.ones(1, 1, L, dtype=torch.bool)), want[None])
    try:
        probe(torch.zeros(1, N, 1), torch.ones(1, 1, N, dtype=torch.bool))
        raise AssertionError("a windowed mask at the token rate was accepted")
    except RuntimeError:
        pass

    # The block run without a window, and with one wider than the sequence: bit for bit the same.
    blocked = outputs(run_flow(s3gen, gen, speech, z, n_steps, token_ends=ends), meanflow, cfm, n_steps)
    wide = outputs(run_flow(s3gen, gen, speech, z, n_steps, token_ends=ends, window=(sink, L)),
                   meanflow, cfm, n_steps)
    diff = equal_all(blocked, wide)
    assert not diff, "a window of %d frames changes %s" % (L, diff)

    # The chosen window acts, in the decoder only, from the first block that loses keys on (the
    # decoder's convolutions are causal, so earlier frames never see the difference).
    cut = next(a for a in [0] + frame_ends[:-1] if a - frames > sink)
    changed = []
    for (name, x, ax), (_, y, _) in zip(stream, blocked):
        if name in ("encoder_out", "mu"):
            assert torch.equal(x, y), "the decoder window changes %s" % name
            continue
        assert torch.equal(x.narrow(ax, 0, cut), y.narrow(ax, 0, cut)), \
            "%s: the window changes frames before %d" % (name, cut)
        if name != "cfm_step0_x":  # z itself
            assert not torch.equal(x.narrow(ax, cut, x.shape[ax] - cut), y.narrow(ax, cut, y.shape[ax] - cut)), \
                "%s: the window of %d frames changes nothing" % (name, frames)
            changed.append(name)
    print("window S=%d W=%d: mask as spelled out; W=%d == no window (bit-identical); W=%d changes a frame >= %d "
          "of %d outputs, encoder_out, mu and frames < %d bit-identical"
          % (sink, frames, L, frames, cut, len(changed), cut), file=sys.stderr)
    return dict(mask_spelled_out=True, wider_than_sequence=dict(frames=L, equals_block_run=True),
                first_windowed_frame=cut, unchanged=["encoder_out", "mu", "every output's frames < %d" % cut],
                changed_at_or_after_first_windowed_frame=changed,
                note="compared with the same blocks without a window: bit for bit except where noted")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixture", type=Path, required=True, help="e.g. tests/fixtures/chatterbox/turbo-tiny")
    ap.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    ap.add_argument("--first", type=int, default=5, help="speech tokens in the first block (after the prompt)")
    ap.add_argument("--hop", type=int, default=7, help="speech tokens per later block")
    ap.add_argument("--seed", type=int, default=97531, help="torch seed of the CFM noise z")
    ap.add_argument("--window", type=int, metavar="FRAMES",
                    help="decoder attention window: a block's frames see the prompt's frames, the FRAMES "
                         "frames before the block and the block (default: no window); writes "
                         "reference/stream-window/")
    args = ap.parse_args()
    var = VARIANTS[args.variant]

    ref_dir = args.fixture / "reference"
    official = args.fixture / "official"
    stages = json.loads((ref_dir / "stages.json").read_text())
    size = stages["meta"]["size"]
    torch.set_num_threads(stages["meta"]["threads"])
    torch.use_deterministic_algorithms(True)

    # The official modules at the fixture's sizes, strict load of the official checkpoint file.
    s3gen = mf.build_s3gen(size, meanflow=var["meanflow"], s3=var["sizes"][size]["s3"])
    ckpt = official / var["checkpoint"]
    state = load_file(ckpt) if ckpt.suffix == ".safetensors" else torch.load(ckpt, weights_only=True)
    s3gen.load_state_dict(state, strict=True)
    s3gen.eval()
    flow = s3gen.flow
    cfm = flow.decoder
    ratio = int(flow.token_mel_ratio)
    lookahead = int(flow.pre_lookahead_len)
    assert lookahead == flow.encoder.pre_lookahead_layer.pre_lookahead_len
    assert ratio == flow.encoder.up_layer.stride

    gen = var["conditionals"].load(official / "conds.pt").gen  # the built-in voice
    speech = torch.from_numpy(np.load(ref_dir / "s3gen_tokens.npy"))
    assert speech.dtype == torch.int64 and speech.ndim == 1 and int(speech.max()) < 6561, speech
    P = int(gen["prompt_token"].shape[1])
    N = P + int(speech.numel())
    ends = block_ends(P, int(speech.numel()), args.first, args.hop)
    assert ends[-1] == N
    n_steps = var["n_timesteps"]
    D = flow.encoder.output_size()

    # The decoder's window: S = the prompt's frames (always visible), W frames before each block.
    S = ratio * P
    window = None
    if args.window is not None:
        if args.window < 0:
            raise ValueError("--window must be at least 0")
        window = (S, args.window)
        if all(a - args.window <= S for a in [0] + [ratio * e for e in ends[:-1]]):
            raise ValueError("--window %d excludes nothing: no block starts more than %d frames after the "
                             "prompt's %d frames" % (args.window, args.window, S))
    win_blocks = window_blocks(ends, ratio, S, args.window) if window else None

    g = torch.Generator().manual_seed(args.seed)
    z = torch.randn(1, flow.output_size, ratio * N, generator=g)

    # Unpatched, with the reference's own z: the fixture's recorded official run comes back.
    ref = lambda name: torch.from_numpy(np.load(ref_dir / f"{name}.npy"))  # noqa: E731
    base_ref = run_flow(s3gen, gen, speech, ref("s3gen_z"), n_steps)
    reproduced = {}  # name -> max |diff|: bit-identical on the machine that wrote them, not on every CPU
    for name, got in [("s3gen_encoder_out", base_ref["enc"]), ("s3gen_mu", base_ref["mu"]),
                      ("s3gen_spks", base_ref["calls"][0]["spks"][:1]),
                      ("s3gen_cond", base_ref["calls"][0]["cond"][:1]), ("s3gen_mel", base_ref["mel"])] + \
            [(f"s3gen_cfm_step{i}_{k}", c[k] if k == "v" else c[k][:1])
             for i, c in enumerate(base_ref["calls"]) for k in ("x", "v")] + \
            ([] if var["meanflow"] else [("s3gen_cfm_t", torch.stack([c["t"][0] for c in base_ref["calls"]]))]):
        if (ref_dir / f"{name}.npy").exists() or name != "s3gen_encoder_out":  # MTL's has no encoder dump
            want = ref(name)
            assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-4, atol=1e-4), \
                "the unpatched run does not reproduce reference/%s.npy" % name
            reproduced[name] = float((got - want).abs().max())
    print("unpatched official run reproduces the s3gen_* dumps, max |diff| %g" % max(reproduced.values()),
          file=sys.stderr)

    # The patched function against a mask spelled out position by position: [i, j] allowed exactly
    # when j's block is not after i's, at both rates; any other length raises.
    probe = block_causal(lambda xs, masks, *a, **k: masks, ends, ratio, [])
    for rate in (1, ratio):
        block_of = [sum(p >= rate * e for e in ends) for p in range(rate * N)]
        want = torch.tensor([[block_of[j] <= block_of[i] for j in range(rate * N)] for i in range(rate * N)])
        pad = torch.ones(1, 1, rate * N, dtype=torch.bool)
        assert torch.equal(probe(torch.zeros(1, rate * N, 1), pad), want[None]), rate
    try:
        probe(torch.zeros(1, N + 1, 1), torch.ones(1, 1, N + 1, dtype=torch.bool))
        raise AssertionError("a mask of N+1 positions was accepted")
    except RuntimeError:
        pass

    # Check 1: a single block covering all N tokens changes nothing.
    full = outputs(run_flow(s3gen, gen, speech, z, n_steps), var["meanflow"], cfm, n_steps)
    one = run_flow(s3gen, gen, speech, z, n_steps, token_ends=[N], window=window)
    diff = equal_all(full, outputs(one, var["meanflow"], cfm, n_steps))
    assert not diff, "one block differs from the unpatched run: %s" % diff
    rates = sorted({r for r, _, _ in one["seen"]})
    assert rates == ["frame", "token"], rates
    print("one block == unpatched: bit-identical (%d masks patched)" % len(one["seen"]), file=sys.stderr)

    # The streaming run.
    res = run_flow(s3gen, gen, speech, z, n_steps, token_ends=ends, window=window)
    stream = outputs(res, var["meanflow"], cfm, n_steps)
    n_token_masks = sum(r == "token" for r, _, _ in res["seen"])
    n_frame_masks = sum(r == "frame" for r, _, _ in res["seen"])
    if window:
        window_checks = check_window(s3gen, gen, speech, z, n_steps, ends, ratio, N, window, stream,
                                     var["meanflow"], cfm)

    # Check 3: more than one block changes the result (the mask acts).
    if len(ends) > 1:
        same = [n for (n, x, _), (_, y, _) in zip(stream, full) if torch.equal(x, y) and n != "cfm_step0_x"]
        assert not same, "block mask without effect on %s" % same

    # Check 2: block causality at every boundary e_k < N, for these blocks and for one block per
    # speech token (every boundary the data allows).
    def perturbed(start):
        other = speech.clone()
        idx = torch.arange(start, speech.numel())
        other[start:] = (speech[start:] + 1000 + 37 * idx) % 6561
        assert (other[start:] != speech[start:]).all()
        return other

    def causality(block_ends_, reference):
        checked, skipped = [], []
        for e in block_ends_[:-1]:
            start = e + lookahead - P  # first speech index that may change
            if start >= speech.numel():
                skipped.append(e)
                continue
            alt = outputs(run_flow(s3gen, gen, perturbed(start), z, n_steps, token_ends=block_ends_,
                                   window=window),
                          var["meanflow"], cfm, n_steps)
            cut = ratio * e
            for (name, x, ax), (_, y, _) in zip(reference, alt):
                assert torch.equal(x.narrow(ax, 0, cut), y.narrow(ax, 0, cut)), \
                    "%s: frames < %d change with tokens >= %d" % (name, cut, e + lookahead)
                if name != "cfm_step0_x":  # z itself
                    assert not torch.equal(x.narrow(ax, cut, x.shape[ax] - cut),
                                           y.narrow(ax, cut, y.shape[ax] - cut)), "%s: no frame >= %d changes" % (name, cut)
            # the lookahead is real: one token earlier already reaches the frames before the boundary
            if start >= 1:
                near = run_flow(s3gen, gen, perturbed(start - 1), z, n_steps, token_ends=block_ends_,
                                window=window)
                assert not torch.equal(near["enc"][:, :cut], reference[0][1][:, :cut]), \
                    "token %d does not reach the frames before %d" % (e + lookahead - 1, cut)
            checked.append(e)
        return checked, skipped

    checked, skipped = causality(ends, stream)
    per_token = block_ends(P, int(speech.numel()), 1, 1)
    fine = outputs(run_flow(s3gen, gen, speech, z, n_steps, token_ends=per_token, window=window),
                   var["meanflow"], cfm, n_steps)
    fine_checked, fine_skipped = causality(per_token, fine)
    print("block ends %s (N=%d, P=%d); causality checked at %s, skipped %s (no speech token at e+%d); "
          "one block per speech token: checked at %s"
          % (ends, N, P, checked, skipped, lookahead, fine_checked), file=sys.stderr)

    # Dumps.
    out = ref_dir / ("stream-window" if window else "stream")
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("stream_*"):
        f.unlink()
    dump = mf.Dumper(out)
    M = var["module"]
    dump("stream_block_ends", torch.tensor(ends, dtype=torch.int64), "input", ["conds.pt:gen.prompt_token",
         "../s3gen_tokens"],
         "exclusive block ends in tokens over prompt_token ++ s3gen_tokens (N=%d, prompt P=%d): first block = "
         "prompt + %d speech tokens, then %d per block, the last takes the rest; frame-rate attention uses "
         "ends * %d" % (N, P, args.first, args.hop, ratio))
    if window:
        dump("stream_window", torch.tensor(window, dtype=torch.int64), "input", ["conds.pt:gen.prompt_token"],
             "[S, W] of the CFM decoder's attention: a frame of the block covering frames [a, b) sees the frames "
             "j < S (the prompt's %d*P=%d: the sink) and max(S, a - W) <= j < b; the encoder is not windowed"
             % (ratio, S))
    masked = "windowed block mask" if window else "block mask"
    window_input = ["stream_window"] if window else []
    named = {n: x for n, x, _ in stream}
    dump("stream_encoder_out", named["encoder_out"], M + ".flow.encoder (UpsampleConformerEncoder), block mask",
         ["conds.pt:gen.prompt_token", "../s3gen_tokens", "stream_block_ends"],
         "layout of s3gen_encoder_out: (1, 2N, D=%d) after after_norm, finalize=True (nothing trimmed); token "
         "attention (first stack) limited to blocks <= own, frame attention (up stack) likewise with ends*%d; "
         "convolutions unmasked (pre-lookahead reads %d following tokens)" % (D, ratio, lookahead))
    dump("stream_mu", named["mu"], M + ".flow.encoder_proj", ["stream_encoder_out"],
         "layout of s3gen_mu: (1, 2N, 80)")
    c0 = res["calls"][0]
    dump("stream_spks", c0["spks"][:1], M + ".flow.spk_embed_affine_layer", ["conds.pt:gen.embedding"],
         "layout of s3gen_spks: (1, 80), Linear(192->80) of F.normalize(embedding); no attention, so the same "
         "values as the full-attention run (s3gen_spks.npy up to the CPU's float sums)")
    dump("stream_cond", c0["cond"][:1], "CausalMaskedDiffWithXvec.inference", ["conds.pt:gen.prompt_feat"],
         "layout of s3gen_cond: (1, 80, 2N), prompt_feat in the first 2P frames, zeros after")
    if not var["meanflow"]:
        dump("stream_cfm_t", torch.stack([c["t"][0] for c in res["calls"]]), "CausalConditionalCFM.forward", [],
             "layout of s3gen_cfm_t: (%d,), t of each Euler step: 1 - cos(pi/2 * linspace(0, 1, %d)) without its "
             "last point (the last step ends at t=1)" % (n_steps, n_steps + 1))
    dump("stream_z", z, "torch.randn(1, 80, 2N, generator=torch.Generator().manual_seed(%d))" % args.seed, [],
         "layout of s3gen_z: (1, 80, 2N), the initial Euler state (= stream_cfm_step0_x), one draw over all 2N "
         "frames (prompt included); injected as the CFM's torch.randn_like(mu) with noised_mels=None"
         + (" (no second noised_mels draw, unlike s3gen_z)" if var["meanflow"] else ""))
    ts = t_span(n_steps, var["meanflow"], cfm)
    for i in range(n_steps):
        prev = ["stream_z"] if i == 0 else [f"stream_cfm_step{i-1}_x", f"stream_cfm_step{i-1}_v"]
        if var["meanflow"]:
            dump(f"stream_cfm_step{i}_x", named[f"cfm_step{i}_x"], "CausalConditionalCFM.basic_euler", prev,
                 "layout of s3gen_cfm_step%d_x: (1, 80, 2N), estimator input at step %d (t=%g, r=%g)"
                 % (i, i, float(ts[i]), float(ts[i + 1])))
            dump(f"stream_cfm_step{i}_v", named[f"cfm_step{i}_v"],
                 M + ".flow.decoder.estimator (ConditionalDecoder, meanflow), " + masked,
                 [f"stream_cfm_step{i}_x", "stream_mu", "stream_spks", "stream_cond", "stream_block_ends"]
                 + window_input,
                 "layout of s3gen_cfm_step%d_v: (1, 80, 2N); next x = x + (r - t) * v" % i)
        else:
            dump(f"stream_cfm_step{i}_x", named[f"cfm_step{i}_x"], "CausalConditionalCFM.solve_euler", prev,
                 "layout of s3gen_cfm_step%d_x: (1, 80, 2N), Euler state before step %d (t=%r; both guidance "
                 "rows take it)" % (i, i, float(ts[i])))
            dump(f"stream_cfm_step{i}_v", named[f"cfm_step{i}_v"],
                 M + ".flow.decoder.estimator (ConditionalDecoder), %s on both rows" % masked,
                 [f"stream_cfm_step{i}_x", "stream_mu", "stream_spks", "stream_cond", "stream_cfm_t",
                  "stream_block_ends"] + window_input,
                 "layout of s3gen_cfm_step%d_v: (2, 80, 2N), raw estimator output: row 0 conditional, row 1 with "
                 "mu, spks and cond zeroed; next x = x + (t[i+1] - t[i]) * (%g v0 - %g v1)"
                 % (i, 1 + cfm.inference_cfg_rate, cfm.inference_cfg_rate))
    last = n_steps - 1
    dump("stream_mel", named["mel"], "CausalMaskedDiffWithXvec.inference, block mask"
         + (" (decoder windowed)" if window else ""),
         [f"stream_cfm_step{last}_x", f"stream_cfm_step{last}_v"],
         "(1, 80, 2N): the final Euler state over ALL frames, the prompt's first 2P=%d included (s3gen_mel "
         "drops them); [..., 2P:] is what the official inference returns" % (ratio * P))

    meta = dict(
        reference=stages["meta"]["reference"], variant=args.variant, size=size,
        threads=torch.get_num_threads(), dtype="float32", device="cpu",
        checkpoint=dict(file="../../official/" + var["checkpoint"], sha256=mf.sha256(ckpt)),
        conds=dict(file="../../official/conds.pt", sha256=mf.sha256(official / "conds.pt")),
        speech_tokens="../s3gen_tokens.npy", prompt_tokens=P, speech_token_count=int(speech.numel()), N=N,
        first=args.first, hop=args.hop, block_ends=ends, frame_block_ends=[ratio * e for e in ends],
        token_mel_ratio=ratio, pre_lookahead_len=lookahead, z_seed=args.seed, n_timesteps=n_steps,
        solver="basic_euler (meanflow, no guidance)" if var["meanflow"] else
               "solve_euler, guidance rate %g over a batch of 2" % cfm.inference_cfg_rate,
        mask_patch="chatterbox.models.s3gen.{transformer.upsample_encoder,decoder}.add_optional_chunk_mask "
                   "replaced by: official result & block[i, j] (j < end of i's block); length N -> token ends, "
                   "length %d*N -> frame ends; anything else raises" % ratio,
        masks_per_run=dict(token=n_token_masks, frame=n_frame_masks),
        checks=dict(
            reproduces_fixture=dict(note="unpatched, with ../s3gen_z as the noise, these s3gen_* dumps come "
                                         "back within 1e-4 (max |diff| per file; the float sums' order depends "
                                         "on the CPU's kernels)", max_abs_diff=reproduced),
            one_block_equals_unpatched=True,
            causality_boundaries_checked=checked,
            causality_boundaries_skipped=skipped,
            causality_one_block_per_speech_token_checked=fine_checked,
            causality="speech tokens from e_k + %d on replaced: every output's frames < %d*e_k bit-identical, "
                      "some later frame differs (each output but step 0's x, which is z); replacing them from e_k + %d on "
                      "changes encoder_out before %d*e_k (the pre-lookahead conv is not masked)"
                      % (lookahead, ratio, lookahead - 1, ratio),
            multi_block_differs=len(ends) > 1,
        ),
    )
    if window:
        meta["window"] = dict(
            frames=args.window, sink_frames=S, file="stream_window.npy",
            rule="CFM decoder only: query i in the block covering frames [a_k, b_k) sees key j iff j < b_k and "
                 "(j < S or j >= max(S, a_k - W)), S = %d*P; the same keys for every query of a block; the "
                 "encoder keeps the plain block mask" % ratio,
            blocks=win_blocks)
        meta["mask_patch"] += "; the decoder's result is further AND'ed with the window (frame rate only)"
        meta["checks"]["window"] = window_checks
    doc = dict(meta=meta, stages=dump.stages)
    (out / "stream_stages.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    total = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print("wrote %s: %d files, %d bytes" % (out, len(list(out.iterdir())), total), file=sys.stderr)


if __name__ == "__main__":
    main()
