"""The realism report as Markdown: the routing table beside the published figures, the fidelity table, the card.

:mod:`specterbench.studies.realism` measures; this module only renders its report (a dict, also kept as
``realism.json`` beside a stand-in's card), so a card can be rewritten from a stored report without loading the
model again.
"""

from __future__ import annotations

from specterbench.studies import fidelity
from specterbench.studies.realism import ROWS, load_published


def format_fidelity(rep: dict) -> str:
    """Markdown table of the fidelity rows beside the published anchors."""

    fid = rep.get("fidelity")
    if not fid:
        return ""
    lines = ["| copy of the model (teacher-forced) | token agreement greedy | sampled T=1 | KL(target‖copy) nats | "
             "expert overlap | exact expert set | exact set per MoE layer |", "|---|---:|---:|---:|---:|---:|---|"]

    def row(label, r):
        layers = " ".join(f"{v:.2f}" for v in r["exact_set_per_layer"])
        lines.append(f"| {label} | {r['greedy']:.3f} | {r['sampled']:.3f} | {r['kl_nats']:.2g} | "
                     f"{r['expert_overlap']:.3f} | {r['exact_set']:.3f} | {layers} |")

    row("routed experts removed (zero output)", fid["experts_removed"])
    for r in fid["drafts"].values():
        row(f"draft {r['label']}", r)
    (ex, ex_src), (gr, gr_src) = fidelity.ANCHORS["exact_set"], fidelity.ANCHORS["greedy"]
    lines.append(f"| published real INT4-g128 / 4-bit draft | {gr:.2f} (0.91–0.94) | – | – | – | {ex:.3f} | – |")
    checks = fid["checks"]
    verdict = ", ".join(f"{key} {'met' if c['ok'] else '**missed**'}"
                        + (f" ({c['value']:.3f} vs {c['band'][0]:g}–{c['band'][1]:g})" if "value" in c else "")
                        for key, c in checks.items())
    scale, head = fid["error_scale"], fid.get("head_error_scale", 1.0)
    cal = (f"calibrated: routed experts' quantization error ×{scale:g} (fitted to the int4 exact-set anchor), the "
           f"dense copy's output head's ×{head:g} (then to greedy agreement 0.92), on training text "
           f"(draft_calibration.json)" if (scale, head) != (1.0, 1.0)
           else "uncalibrated (the model's own quantization error)")
    lines += ["", f"{fid['windows']} held-out windows × {fid['seq_len']} tokens; sampled: the default decode's "
              f"Gumbel noise shared by model and copy. Drafts {cal}. Anchors: {ex_src}; {gr_src}. Checks: {verdict}."]
    return "\n".join(lines)


def _fmt(value, fmt: str) -> str:
    return "–" if value is None or (isinstance(value, float) and value != value) else format(value, fmt)


def format_table(rep: dict) -> str:
    """Markdown table: stand-in teacher-forced and on the default decode, the published value, the difference
    (teacher-forced − published) and whether it is within tolerance."""
    title = rep.get("published_title") or "published"
    tf, dec, pub, checks = rep["teacher_forced"], rep.get("decode") or {}, rep["published"], rep["checks"]
    lines = [f"| metric | {rep['model']} teacher-forced | {rep['model']} default decode | {title} | difference | "
             f"tolerance |", "|---|---:|---:|---:|---:|---|"]
    for key, label, fmt in ROWS:
        if key not in tf and key not in dec:
            continue
        diff = tf[key] - pub[key] if key in pub and key in tf else None
        tol = checks.get(key)
        mark = "–" if tol is None else (f"±{tol['tolerance']:g} " + ("met" if tol["ok"] else "**missed**"))
        dfmt = "+.1f" if fmt == ".1f" else "+.3f"
        lines.append(f"| {label} | {_fmt(tf.get(key), fmt)} | {_fmt(dec.get(key), fmt)} | {_fmt(pub.get(key), fmt)} "
                     f"| {_fmt(diff, dfmt)} | {mark} |")
    st = rep["setup"]
    verdict = "all within tolerance" if rep["within_tolerance"] else "NOT all within tolerance"
    lines += ["", f"Teacher-forced: {st['heldout_windows']} held-out windows × {st['seq_len']} tokens; default decode: "
              f"{st['decode'] or 'not measured'}, {st['decode_prompts']} benchmark prompts × {st['decode_new_tokens']} "
              f"new tokens (routing of the generated tokens). E={st['num_experts']}, top-{st['top_k']}, "
              f"{st['moe_layers']} MoE layers. Toleranced metrics: {verdict}."]
    return "\n".join(lines)


def card_section(rep: dict) -> str:
    """The model card's realism section."""
    src = load_published()["sources"]
    return "\n".join([
        "## Realism: routing beside the real model",
        "",
        f"`specterbench realism --model {rep['model']}`. Published values of {rep.get('published_title')}: "
        f"{src['paper']}; LRU/Belady {src['lru_rho1']}, SRP {src['srp_m16']}, SCH {src['sch_rho2_m16']}. "
        "Definitions (model-level cache of ρ·L·k (layer, expert) entries reset per sequence, SRP, SCH v3) follow "
        f"{src['code']}: a token's accesses are decided against the cache as it stood when the token began, and an "
        "entry's first access counts as a hit while the cache has never been full. The *execution order* rows read "
        "the same traces through a plain LRU in the order an engine runs them (layer by layer, every first access a "
        "miss), a stricter reading beside the same published figure. Tolerances: ±0.08 on LRU ρ=1, ρ=2 (ρ=2 in both "
        "readings) and Belady ρ=2, ±8 points on SRP.",
        "",
        format_table(rep),
        "",
        "### Do the experts matter, and do drafts err like real ones?",
        "",
        format_fidelity(rep),
        "",
    ])
