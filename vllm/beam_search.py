"""Beam search over the engine: every step is one batch of 1-token requests, one per
live beam, asking for the top `2 * beam_width` logprobs (as vLLM does). Beams of a
prompt re-submit their whole token list each step, so with prefix caching they share
the KV blocks of their common prefix instead of recomputing it.

Selection follows transformers' `generate(num_beams=k, do_sample=False)`:

- the candidates are every live beam extended by one of its top tokens, ranked by
  cumulative logprob; the best `2k` are kept;
- a candidate that ends in EOS finishes, but only if it ranks in the top k (the others
  are spares); it is scored `cum_logprob / generated_len ** length_penalty`, EOS
  counted in the length (transformers' convention; vLLM divides by the whole length,
  prompt included, EOS excluded, so `length_penalty` weighs differently there);
- the best k candidates that did not finish live on;
- at `max_tokens` the top k candidates all finish;
- the search stops early once k beams finished and the best live beam, scored at
  its current length, cannot beat the worst finished one (`early_stopping=False`).

Without EOS (or with `ignore_eos`) this is plain beam search and the length penalty
cannot change the order (all beams have the same length).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from vllm.outputs import RequestOutput
from vllm.sampling_params import BeamSearchParams, SamplingParams
from vllm.sequence import Logprob


@dataclass
class BeamSearchSequence:
    """One beam: `tokens` holds the prompt and the generated tokens (as in vLLM)."""
    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: Optional[str] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[int] = None
    score: float = 0.0
    """cum_logprob normalized by the length penalty (how beams were ranked)."""


@dataclass
class BeamSearchOutput:
    """The best `beam_width` sequences of one prompt, best first."""
    sequences: list[BeamSearchSequence]


def beam_search_score(cum_logprob: float, num_generated: int, length_penalty: float) -> float:
    return cum_logprob / (num_generated ** length_penalty)


@dataclass
class BeamSearchInstance:
    """The search state of one prompt."""
    prompt_len: int
    beams: list[BeamSearchSequence]
    finished: list[BeamSearchSequence] = field(default_factory=list)
    done: bool = False


def _candidates(beams: list[BeamSearchSequence],
                outputs: list[RequestOutput]) -> list[tuple[BeamSearchSequence, int, Logprob]]:
    """(beam, token, logprob) for every top token of every beam, best cumulative first."""
    cands = []
    for beam, out in zip(beams, outputs):
        step = out.outputs[0].logprobs[0]
        cands.extend((beam, tok, lp) for tok, lp in step.items())
    cands.sort(key=lambda c: c[0].cum_logprob + c[2].logprob, reverse=True)
    return cands


def _extend(beam: BeamSearchSequence, token: int, lp: Logprob,
            step_logprobs: dict[int, Logprob]) -> BeamSearchSequence:
    return BeamSearchSequence(tokens=beam.tokens + [token],
                              logprobs=beam.logprobs + [step_logprobs],
                              cum_logprob=beam.cum_logprob + lp.logprob)


def _advance(inst: BeamSearchInstance, outputs: list[RequestOutput], params: BeamSearchParams,
             eos_token_id: Optional[int], last_step: bool) -> None:
    """One step of one prompt's search (see the module docstring)."""
    width, penalty = params.beam_width, params.length_penalty
    step_of = {id(b): o.outputs[0].logprobs[0] for b, o in zip(inst.beams, outputs)}
    live: list[BeamSearchSequence] = []
    for rank, (beam, tok, lp) in enumerate(_candidates(inst.beams, outputs)[:2 * width]):
        is_eos = tok == eos_token_id and not params.ignore_eos
        if is_eos or last_step:
            if rank < width:
                new = _extend(beam, tok, lp, step_of[id(beam)])
                new.finish_reason = "stop" if is_eos else "length"
                new.stop_reason = tok if is_eos else None
                new.score = beam_search_score(new.cum_logprob,
                                              len(new.tokens) - inst.prompt_len, penalty)
                inst.finished.append(new)
            continue
        if len(live) < width:
            live.append(_extend(beam, tok, lp, step_of[id(beam)]))
    inst.finished.sort(key=lambda b: b.score, reverse=True)
    del inst.finished[width:]
    inst.beams = live
    if last_step or not live:
        inst.done = True
    elif len(inst.finished) == width:
        best = beam_search_score(live[0].cum_logprob, len(live[0].tokens) - inst.prompt_len,
                                 penalty)
        inst.done = best <= inst.finished[-1].score


class BeamSearch:
    """The search of a batch of prompts, driven step by step by the caller (so the
    offline LLM and the async server share it): `batch()` gives the token lists to run
    as 1-token requests with `step_params`, `advance(outputs)` consumes their outputs
    in the same order, `results()` gives the answer once `done`."""

    def __init__(self, prompts: Sequence[list[int]], params: BeamSearchParams,
                 eos_token_id: Optional[int]) -> None:
        self.params = params
        self.eos_token_id = eos_token_id
        self.step_params = SamplingParams(max_tokens=1, logprobs=2 * params.beam_width,
                                          temperature=params.temperature, ignore_eos=True)
        self.instances = [BeamSearchInstance(len(p), [BeamSearchSequence(tokens=list(p))])
                          for p in prompts]
        self.steps = 0
        self._active: list[BeamSearchInstance] = []

    @property
    def done(self) -> bool:
        return self.steps >= self.params.max_tokens or all(i.done for i in self.instances)

    def batch(self) -> list[list[int]]:
        self._active = [inst for inst in self.instances if not inst.done]
        return [beam.tokens for inst in self._active for beam in inst.beams]

    def advance(self, outputs: list[RequestOutput]) -> None:
        last = self.steps == self.params.max_tokens - 1
        start = 0
        for inst in self._active:
            n = len(inst.beams)
            _advance(inst, outputs[start:start + n], self.params, self.eos_token_id, last)
            start += n
        self.steps += 1

    def results(self, detokenize: Callable[[list[int]], str]) -> list[BeamSearchOutput]:
        out = []
        for inst in self.instances:
            for beam in inst.finished:
                generated = beam.tokens[inst.prompt_len:]
                if beam.finish_reason == "stop" and not self.params.include_stop_str_in_output:
                    generated = generated[:-1]
                beam.text = detokenize(generated)
            out.append(BeamSearchOutput(sequences=inst.finished))
        return out


def run_beam_search(prompts: Sequence[list[int]], params: BeamSearchParams,
                    eos_token_id: Optional[int],
                    generate: Callable[[list[list[int]], SamplingParams], list[RequestOutput]],
                    detokenize: Callable[[list[int]], str]) -> list[BeamSearchOutput]:
    """Beam search for every prompt (token ids); `generate(token_lists, params)` runs one
    batch of requests and returns their outputs in order."""
    search = BeamSearch(prompts, params, eos_token_id)
    while not search.done:
        search.advance(generate(search.batch(), search.step_params))
    return search.results(detokenize)
