"""What README.md and docs/audit.md quote about the audited kernels, as passages.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from flashnum.figures.audit import kernel_grad_markdown, kernel_table_markdown
from flashnum.figures.docs.digits import ceil_to, pct, pct_floor, sci, thousands
from flashnum.figures.docs.sources import bench, last_run, table
from flashnum.figures.quoting import Passage, require
from flashnum.reproduce.qiu_yao_bias import CASES, PAIRS
from flashnum.studies.kernel_agreement import torch_cpu_backward_summary as torch_cpu_summary

# the gradient audit: experiments/kernel_audit_backward (rows, each report's audit.json)
BACKWARD = "kernel_audit_backward"
RULES = ("dq_rule", "dk_rule", "dv_rule", "grad_nonfinite")
GRADS = ("dq", "dk", "dv")


def qiu_yao_cases(F) -> list[dict]:
    """experiments/qiu_yao_agreement as one dict per row, params decoded, in the order of
    its cases (docs/audit.md's table)."""
    order = [(c[0], json.dumps(c[1], sort_keys=True), c[3], c[4], v) for c in CASES
             for _, v in PAIRS]
    rows = table(F, "qiu_yao_agreement").to_dict("records")
    rows.sort(key=lambda c: order.index((c["distribution"], c["params"], c["d"], c["causal"],
                                         c["variant"])))
    return [{**c, "params": json.loads(c["params"])} for c in rows]


def torch_cpu_docs(F):
    """The torch_cpu model against torch's kernel: its agreement from
    experiments/torch_cpu_forward, its speed from bench/results/torch_cpu.json."""
    c = table(F, "torch_cpu_forward")
    out = []
    for p in ("fp32", "bf16", "fp16"):
        x = c[c.precision == p]
        bitwise = (x.bitwise * x.elements).sum() / x.elements.sum()
        out.append(f"| {p} | {len(x)} | {thousands(int(x.elements.sum()))} | "
                   f"{100 * bitwise:.4f}% | {100 * x.bitwise.min():.4f}% | "
                   f"{100 * x.lse_bitwise.min():.4f}% | {x.max_ulps.max():.0f} |")
    shape = ["batch", "heads", "seq_len_q", "seq_len_k", "head_dim"]
    shapes = ["x".join(map(str, s)) for s in sorted(set(c[shape].itertuples(index=False)))]
    require(set(c.seed) == {0} and c.groupby("precision").causal.mean().eq(0.5).all(),
            "every case is seed 0, half of each dtype's cases causal")
    out.append("Shapes (B x H x Nq x Nk x d): " + ", ".join(shapes) + "; each causal and not, "
               "seed 0")
    t = bench(F, "torch_cpu")
    tm = pd.DataFrame(t["timings"])
    big, small = tm[tm.torch_cpu_s >= 2e-3], tm[tm.torch_cpu_s < 2e-3]
    s = t["summary"]
    la = t["load_average"]
    return out + [
        f"The model costs {s['median_cpu_time_ratio']:.1f}x torch's bf16 SDPA in process CPU "
        f"time (median over the {len(tm)} bf16 timings; wall {s['median_time_ratio']:.1f}x), "
        f"measured on the idle machine (load average over 1, 5 and 15 minutes at the end of "
        f"the run {min(la):.1f}-{max(la):.1f}): {big.cpu_ratio.min():.1f}-"
        f"{big.cpu_ratio.max():.1f}x on the {len(big)} timings where torch's call takes at "
        f"least 2 ms of CPU, and up to {small.cpu_ratio.max():.1f}x on the {len(small)} where "
        f"it takes less ({1e3 * small.torch_cpu_s.min():.1f}-"
        f"{1e3 * small.torch_cpu_s.max():.1f} ms)"]


def qiu_yao_agreement_table(F):
    q = qiu_yao_cases(F)
    key = lambda c: (c["distribution"], json.dumps(c["params"]), c["d"], c["causal"])  # noqa: E731
    by = {}
    for c in q:
        by.setdefault(key(c), {})[c["variant"]] = c
    cell = lambda c: f"{100 * c['bitwise']:.4f}% (max diff {c['max_diff']:.2g})"  # noqa: E731
    out = []
    for row in by.values():
        c = row["fa2"]
        params = ", ".join(f"{k}={v}" for k, v in c["params"].items())
        name = c["distribution"] + (f", {params}" if params else "")
        out.append(f"| {name} (median row max {c['median_row_max']:.2f}) | {c['d']} | "
                   f"{'yes' if c['causal'] else 'no'} | {cell(c)} | "
                   f"{cell(row['qiu_yao_released'])} | {cell(row['qiu_yao'])} |")
    plain = [c for c in q if c["variant"] in ("fa2", "qiu_yao_released")]
    worst = max(1 - c["bitwise"] for c in plain)
    sig = [c for c in q if c["variant"] == "qiu_yao" and c["params"].get("sigma") == 0.34][0]
    gauss = max(c["max_diff"] for c in plain if c["median_row_max"] < 4)
    return out + [f"agrees with it on >= {pct_floor(1 - worst)} of the elements in every case",
                  f"(the {100 * (1 - sig['bitwise']):.0f}% disagreement of the idealised "
                  f"variant at sigma = 0.34)",
                  f"on at most {ceil_to(100 * worst, 2)}% of the elements, at most "
                  f"{gauss:.2g} on gaussian inputs"]


def qiu_yao_clamp_audit(F):
    q = table(F, "repro_qiu_yao")
    c = q[(q.distribution == "clamp_sweep") & (q.policy == "lowp")
          & (q.variant == "qiu_yao_released")].set_index("max_logit").ours
    return [f"{c[24]:.2f} at M = 24, {sci(c[35])} at M = 35, {sci(c[40])} at M = 40"]


def tutorial_forward(F) -> list[dict]:
    """experiments/triton_tutorial_forward's rows in the order run (N, causal, sm_scale)."""
    df = table(F, "triton_tutorial_forward").sort_values(["n", "causal", "sm_scale"])
    return df.to_dict("records")


def tutorial_docs(F):
    cases = tutorial_forward(F)
    out = [f"| {c['n']} | {'yes' if c['causal'] else 'no'} | {c['sm_scale']} | "
           f"{100 * c['bitwise_twice']:.3f}% | {100 * c['bitwise_once']:.3f}% |"
           for c in cases]
    pos = [1 - c["bitwise_twice"] for c in cases if c["bitwise_twice"] < 1]
    return out + [f"The remaining {100 * min(pos):.3f}-{100 * max(pos):.2f}% are"]


def tutorial_readme(F):
    cases = tutorial_forward(F)
    twice = [c["bitwise_twice"] for c in cases]
    once = [c["bitwise_once"] for c in cases if c["sm_scale"] == 1.3]
    lo = lambda x: pct_floor(x, 2)[:-1]  # noqa: E731 (a range's lower end, no % sign)
    return [f"on {lo(min(twice))}-{pct(max(twice), 0)} of the elements",
            f"the other form gives {lo(min(once))}-{pct_floor(max(once), 2)}"]


def triton_tutorial_backward(F) -> dict:
    """experiments/triton_tutorial_backward: its rows in the order run (N, then causal, then
    sm_scale), and the versions its manifest records."""
    df = table(F, "triton_tutorial_backward").sort_values(["n", "causal", "sm_scale"])
    versions = last_run(F, "triton_tutorial_backward")["versions"]
    return dict(cases=df.to_dict("records"), numpy=versions["numpy"], triton=versions["triton"])


def tutorial_backward_docs(F):
    t = triton_tutorial_backward(F)
    cases, grads = t["cases"], ("dq", "dk", "dv")

    def cell(c, a):
        return " / ".join(f"{100 * c[f'{a}_{g}']:.2f}" for g in grads)

    rows = [f"| {c['n']} | {'yes' if c['causal'] else 'no'} | {c['sm_scale']} | "
            + " | ".join(cell(c, a) for a in ("interpreter", "exp2", "sum", "engine", "fa2"))
            + " |" for c in cases]
    require(all(c[f"engine_{g}"] == 1.0 for c in cases for g in ("out", *grads)),
            "the engine's model equals the kernel on out, dQ, dK, dV in every case")
    small = [c for c in cases if c["sm_scale"] < 1]
    big = [c for c in cases if c["sm_scale"] == 1.3]
    require(all(c["exp2_dq"] == c["interpreter_dq"] for c in big),
            "at sm_scale 1.3 the exp2 alone does not change dQ's agreement")
    least = min(c[f"interpreter_{g}"] for c in small for g in grads)
    dq13 = [c["interpreter_dq"] for c in big]
    dq13sum = [c["sum_dq"] for c in big]
    ulps = max(c[f"max_diff_ulps_of_max_{g}"] for c in cases for g in grads)
    fa2 = [c[f"fa2_{g}"] for c in cases for g in grads]
    return rows + [
        f"every entry of out, dQ, dK and dV in all {len(cases)} cases",
        f"on at least {100 * least:.2f}% of each gradient at sm_scale 0.125 and 0.5",
        f"At 1.3 dQ agrees on only {100 * min(dq13):.2f}-{100 * max(dq13):.2f}%",
        f"brings it to {100 * min(dq13sum):.2f}-{100 * max(dq13sum):.2f}%",
        f"at most {ulps:g} fp16 ulp of the gradient's largest entry",
        f"The baseline's {100 * min(fa2):.0f}-{100 * max(fa2):.0f}% come from",
        f"numpy {t['numpy']}", f"Triton {t['triton']}",
        f"agrees on {100 * min(c['interpreter_out'] for c in cases):.2f}-"
        f"{100 * max(c['interpreter_out'] for c in cases):.2f}%"]


def tutorial_backward_readme(F):
    lines = tutorial_backward_docs(F)
    least = next(x for x in lines if x.startswith("on at least")).split()[3]
    fa2 = next(x for x in lines if x.startswith("The baseline's")).split()[2]
    return [f"on at least {least} of entries at sm_scale 0.125 and 0.5",
            f"The fa2 backward with exp2 equals the kernels on {fa2} of entries"]


def kernel_audit_docs(F):
    k = table(F, "kernel_audit")
    k = k.assign(r=k.err_max / k.fa_bound)
    sdpa = k[k.target == "torch_sdpa"]
    tri = k[k.target == "flashnum_triton"]
    n = sdpa.groupby("precision").size()
    worst = sdpa.groupby("precision").r.max()
    require(n.nunique() == 1 and bool(k.passed.astype(bool).all()),
            "every dtype has the same number of cases and every case passed")
    require(bool((sdpa.model_bitwise == 1).all()),
            "the torch_cpu model equals torch's SDPA bit for bit in every case")
    b = sdpa[sdpa.precision == "bf16"]
    wall = last_run(F, "kernel_audit")['wall_s']
    return [f"(default budget, {n.iloc[0]} cases each) and flashnum's Triton kernel on the CPU "
            f"interpreter in bf16 (quick budget, {len(tri)} cases)",
            f"the median ratio of torch's error to the emulated fa2's is "
            f"{(b.err_max / b.fa2_err_max).median():.1f}, to standard attention's in bf16 "
            f"{(b.err_max / b.std_err_max).median():.2f}, to lowp's "
            f"{(b.err_max / b.lowp_err_max).median():.2f}",
            f"the worst kernel error is {worst['bf16']:.2f} (bf16), {worst['fp16']:.2f} (fp16) "
            f"and {worst['fp32']:.2f} (fp32) of flash-attn's bound",
            f"on {100 * tri.model_bitwise.mean():.3f}% of the elements on average over the cases "
            f"(worst case {100 * tri.model_bitwise.min():.3f}%;",
            f"the whole experiment with the fa2/lowp comparison, {wall:.0f} s"]


def _kernel_table(F):
    k = table(F, "kernel_table")
    return k, k[k.status == "ran"].set_index(["target", "precision"])


def kernel_table_readme(F):
    k, r = _kernel_table(F)
    low = r[r.index.get_level_values("precision") != "fp32"]
    return [f"output on at least {100 * low.model_bitwise.min():.2f}% of the elements"]


def kernel_table_docs(F):
    k, r = _kernel_table(F)
    low = r[r.index.get_level_values("precision") != "fp32"]
    fp32 = r.xs("fp32", level="precision")
    others = fp32[~fp32.model.isin(["torch_cpu", "torch_math"])]
    tm, pal = r.loc["torch_math"], r.loc["jax_pallas"]
    pal = pal.drop("fp32")
    dqk = pd.concat([pal.grad_closest_dq_bitwise, pal.grad_closest_dk_bitwise])
    eager_xla = r.loc[["jax_xla", "hf_eager"]]
    require((fp32.loc[["torch_sdpa", "torch_flash_cpu", "torch_math"]].model_bitwise == 1).all(),
            "in fp32 torch_sdpa, torch_flash_cpu and torch_math equal their models bit for bit")
    require(eager_xla.grad_closest_bitwise.max() < 0.75,
            "jax_xla's and hf_eager's gradients equal their closest model on under 75%")
    mha = r.loc["ort_mha"]
    require((mha.worst_case == "gaussian/B1H2/Nq100Nk300/d64/causal/s0").all(),
            "ort_mha's worst case is gaussian/B1H2/Nq100Nk300/d64/causal/s0")
    eager = r.loc["hf_eager"]
    require((eager.broken_masked == 2).all() and (eager.broken_grad_masked == 2).all(),
            "hf_eager breaks the masked-row rule in 2 cases, forward and gradients")
    f32 = tm.loc["fp32"]
    require(f32.worst_case == f32.grad_worst_case == "late_max/B2H1/Nq77Nk77/d128/causal/s0",
            "torch_math's fp32 worst case is late_max/B2H1/Nq77Nk77/d128/causal/s0")
    unsupported = k[k.status.str.startswith("unsupported")]
    require(set(zip(unsupported.target, unsupported.precision, strict=True)) == {
        ("ort_attention", "bf16"), ("ort_mha", "bf16"), ("jax_xla", "fp16")},
            "exactly ort_attention bf16, ort_mha bf16 and jax_xla fp16 are unsupported")
    wall = last_run(F, "kernel_table")['wall_s']
    return [kernel_table_markdown(k), kernel_grad_markdown(k), f"{wall:.0f} s wall",
            f"least {100 * low.model_bitwise.min():.2f}% of the elements",
            f"within one ulp on {math.floor(100 * others.model_ulp1.min())}-"
            f"{math.ceil(100 * others.model_ulp1.max())}% of the elements",
            f"({100 * tm.loc['bf16'].grad_model_bitwise:.2f}% bf16, "
            f"{100 * tm.loc['fp16'].grad_model_bitwise:.2f}% fp16)",
            f"`fa2` on {100 * r.loc[('flashnum_triton', 'bf16')].grad_model_bitwise:.2f}% (bf16)",
            f"on {100 * pal.grad_closest_dv_bitwise.min():.0f}% of the entries, its dQ and dK on "
            f"{100 * dqk.min():.0f}-{100 * dqk.max():.0f}%",
            f"by {mha.loc['fp16'].worst_ratio:.0f}x and "
            f"{mha.loc['fp32'].worst_ratio / 1000:,.0f},000x the bound",
            f"its error is {f32.worst_ratio:.2f}x flash-attn's bound, dK's "
            f"{f32.grad_worst_ratio:.2f}x"]


def audit_readme(F):
    t = bench(F, "torch_cpu")
    elements = sum(c["elements"] for c in t["cases"])
    require(t["summary"]["bitwise"] == 1.0 and t["summary"]["worst_case_bitwise"] == 1.0,
            "the torch_cpu model equals torch's CPU kernel on every element")
    q = qiu_yao_cases(F)
    plain = min(c["bitwise"] for c in q if c["variant"] == "fa2")
    fix = [1 - c["bitwise"] for c in q if c["variant"] == "qiu_yao" and c["distribution"] == "ties"]
    released = min(c["bitwise"] for c in q if c["variant"] == "qiu_yao_released")
    k = table(F, "kernel_audit")
    k = k.assign(r=k.err_max / k.fa_bound)
    sdpa = k[k.target == "torch_sdpa"].groupby("precision")
    tri = k[k.target == "flashnum_triton"]
    n = sdpa.size()
    require(n.nunique() == 1 and bool(k.passed.astype(bool).all()),
            "every dtype has the same number of cases and every case passed")
    worst = ", ".join(f"{sdpa.r.max()[p]:.2f}" for p in ("bf16", "fp16", "fp32"))
    return [f"of {elements / 1e6:.1f} million output elements",
            f"It costs {t['summary']['median_cpu_time_ratio']:.1f}x torch's bf16 SDPA in CPU time",
            f"bit for bit on >= {pct_floor(plain)} of the elements",
            f"disagree on {100 * min(fix):.0f}-{100 * max(fix):.0f}% of the outputs",
            f"equals it on >= {pct_floor(released)} of the elements in every case",
            f"({n.iloc[0]} cases each; worst error {worst} of the bound) and flashnum's Triton "
            f"kernel in bf16 ({len(tri)} cases)"]


def rows(F) -> pd.DataFrame:
    return table(F, BACKWARD)


def report(F, target, precision) -> dict:
    return json.loads((Path(F.experiments) / BACKWARD / f"{target}-{precision}"
                       / "audit.json").read_text())


def backward_table(F) -> list[str]:
    out = ["| target | precision | budget | cases | kept every rule | dq_rule | dk_rule | "
           "dv_rule | grad_nonfinite | fa_rule | worst case: gradient, error / limit |"]
    for (target, precision), g in rows(F).groupby(["target", "precision"], sort=False):
        broken = [int(g.failed.str.split(",").map(lambda f, r=r: r in f).sum())
                  for r in (*RULES, "fa_rule")]
        w = report(F, target, precision)["worst"]
        budget = "quick" if len(g) == 8 else "default"
        out.append(f"| {target} | {precision} | {budget} | {len(g)} | {int(g.passed.sum())} | "
                   + " | ".join(map(str, broken))
                   + f" | `{w['id']}`: {w['quantity']}, {w['ratio']:.2f} |")
    return out


def backward_findings(F) -> list[str]:
    t = rows(F)
    sdpa = t[t.target == "torch_sdpa"]
    require(not sdpa.failed.str.contains("fa_rule").any(),
            "torch_sdpa never breaks flash-attn's rule")
    require(not sdpa.passed.all(),
            "torch_sdpa breaks some gradient rule")
    closest = {p: report(F, "torch_sdpa", p)["diagnosis"]["closest"] for p in ("bf16", "fp16",
                                                                          "fp32")}
    require(all(c["policy"] == "torch_cpu" for c in closest.values()),
            "torch_cpu is the closest model of torch_sdpa's backward in every dtype")
    shares = pd.read_csv(Path(F.experiments) / BACKWARD / "torch_sdpa-fp32" / "diagnosis.csv")
    preset = shares[shares.policy != "torch_cpu"].iloc[0]
    over = t[(t.target == "torch_sdpa") & (t.distribution == "near_overflow")
             & (t.precision == "fp16")].iloc[0]
    require("grad_nonfinite" in over.failed and over.dk_std_err_max == float("inf"),
            "fp16 near_overflow: standard attention's dK overflows")
    tri = t[(t.target == "flashnum_triton")]
    ties = tri[tri.distribution == "ties"].iloc[0]
    require(ties.dq_err_max == ties.model_dq_err_max and "dq_rule" in ties.failed,
            "the Triton kernel's dQ on ties errs as its model's does and breaks dq_rule")
    wall = last_run(F, BACKWARD)["wall_s"]
    share = ", ".join(f"{100 * closest[p]['bitwise']:.2f}% ({p})" for p in closest)
    bf16 = t[(t.target == "torch_sdpa") & (t.precision == "bf16")]
    grad_broken = bf16.failed.str.contains("_rule|grad_", regex=True).sum()
    return [f"backward=true` exits 1 ({grad_broken} of {len(bf16)} cases break a gradient rule)",
            f"the torch_cpu model of its backward equals its values bit for bit ({share} "
            f"of every output and gradient value)",
            f"no preset comes closer than {100 * preset.bitwise:.1f}% ({preset.model})",
            f"its dQ errs by {ties.dq_err_max / ties.dq_bound:.2f} of the limit",
            f"(equal bit for bit on {100 * ties.model_dq_bitwise:.1f}% of that case's dQ)",
            f"The experiment took {wall:.0f} s wall"]


def ports(F) -> list[str]:
    out = []
    for r in table(F, "audit_ports").sort_values("port").itertuples():
        nxt = ", ".join(f"{x['model']} {100 * x['bitwise']:.1f}%" for x in json.loads(r.next)[:2])
        out.append(
            f"- `{r.port}`: {r.cases - r.kept} of {r.cases} cases break "
            f"{', '.join(sorted(json.loads(r.broken)))}; the worst is `{r.worst_id}` "
            f"({r.worst_quantity} error {r.worst_err:.3g}, {r.worst_ratio:.3g}x its limit). "
            f"Closest model: {r.closest_model}, equal bit for bit on "
            f"{100 * r.closest_bitwise:.2f}% of the outputs of the {r.closest_cases} cases it "
            f"can take (next: {nxt})." + (
                f" Dominant site: {r.site} ({r.site_format}; alone {r.site_err_only:.3g}, "
                f"the model's {r.site_total:.3g})." if r.reproduced else
                " No model reproduces it (none reaches 99%), so no site is attributed."))
        if r.reproduced and r.site_kernel_err > 2 * r.site_total:
            out.append(f"There the kernel errs {r.site_kernel_err / r.site_total:.3g}x as much "
                       "as the model: more than the model's roundings explain.")
    return out


def torch_diagnosis(F) -> list[str]:
    parts = []
    for p in ("bf16", "fp16", "fp32"):
        c = report(F, "torch_sdpa", p)["diagnosis"]["closest"]
        parts.append(f"{p}: {c['model']}, {100 * c['bitwise']:.2f}% of {c['cases']} cases")
    return ["closest model " + "; ".join(parts)]


def torch_cpu_backward(F) -> dict:
    """experiments/torch_cpu_backward: its summary, its rows in the layout of the text (shape
    as a list, fa2's shares), and the run: its command, torch's version, the machine."""
    df = table(F, "torch_cpu_backward")
    run = last_run(F, "torch_cpu_backward")
    shape = ("batch", "heads", "seq_len_q", "seq_len_k", "head_dim")
    cases = [dict(precision=r["precision"], shape=[r[k] for k in shape], causal=r["causal"],
                  forward_bitwise=r["forward_bitwise"],
                  fa2={n: r[f"fa2_{n}"] for n in GRADS}) for r in df.to_dict("records")]
    first = df.iloc[0]
    return dict(summary=torch_cpu_summary(df), cases=cases, torch=run["versions"]["torch"],
                command="python -m flashnum.run " + " ".join(run["command"]["overrides"]),
                threads=int(first.threads), cpu_count=int(first.cpu_count), machine=first.cpu)


def torch_cpu_backward_docs(F):
    t = torch_cpu_backward(F)
    s, cases = t["summary"], t["cases"]
    out = [f"`{t['command'].strip()}`, torch {t['torch']}, {t['threads']} threads, "
           f"{t['cpu_count']}-core {t['machine']}"]
    for p in ("fp32", "bf16", "fp16"):
        b, e = s[p]["backward"], s[p]["end_to_end"]
        worst = min(b[n]["worst"] for n in GRADS)
        cells = [pct(b[n]["share"], 4) for n in GRADS]
        e2e = " / ".join(pct(e[n]["share"], 3) for n in GRADS)
        base = [" / ".join(pct(s[p][w][n]["share"], 1) for n in GRADS) for w in ("fa2", "naive")]
        out.append(f"| {p} | {b['dq']['comparisons']} | " + " | ".join(cells)
                   + f" | {pct(worst, 4)} | {e2e} | {base[0]} | {base[1]} |")
    shapes = sorted({tuple(c["shape"]) for c in cases})
    require(all(sum(c["causal"] for c in cases if tuple(c["shape"]) == sh) == 3 for sh in shapes),
            "each shape runs causal and not in each of the three dtypes")
    out.append("Shapes (B x H x Nq x Nk x d): " + ", ".join("x".join(map(str, sh))
                                                            for sh in shapes)
               + "; each causal (top-left) and not, seed 0")
    # the comparison: N = 600, d = 64, bf16 and fp16, fa2 with 64 x 64 blocks
    at600 = [c["fa2"][n] for c in cases if c["shape"] == [1, 2, 600, 600, 64]
             and c["precision"] != "fp32" for n in GRADS]
    out.append(f"at N = 600, d = 64 (bf16 and fp16, causal or not) fa2 equals it on "
               f"{100 * min(at600):.0f}-{100 * max(at600):.0f}% of the dQ, dK, dV entries")
    fwd = min(c["forward_bitwise"] for c in cases)
    e2e = min(s[p]["end_to_end"][n]["worst"] for p in ("fp32", "bf16", "fp16") for n in GRADS)
    out.append(f"with flashnum's own torch_cpu forward (equal to torch's on {pct(fwd, 4)} of "
               f"the outputs in the worst comparison) on {pct(e2e, 4)} or more of the entries "
               f"of each comparison")
    return out


def torch_cpu_backward_readme(F):
    t = torch_cpu_backward(F)
    s = t["summary"]
    shares = [s[p][w][n]["share"] for p in ("fp32", "bf16", "fp16") for n in GRADS
              for w in ("backward", "end_to_end")]
    counts = {s[p]["backward"]["dq"]["comparisons"] for p in ("fp32", "bf16", "fp16")}
    require(len(set(shares)) == 1 and len(counts) == 1,
            "one share in every dtype, backward and end to end, and one count")
    return [f"on {pct(shares[0], 4)} of the dQ, dK and dV entries in fp32, bf16 and fp16",
            f"{counts.pop()} comparisons per dtype",
            f"equals it on {pct(s['bf16']['fa2']['dq']['share'], 1)} of bf16 dQ entries"]


PASSAGES = {
    "AuditTorchCpu": Passage("docs/audit.md: the torch_cpu model against torch's CPU kernel "
                             "(experiments/torch_cpu_forward, bench/results/torch_cpu.json)",
                             torch_cpu_docs),
    "AuditQiuYaoAgreement": Passage("docs/audit.md: Qiu & Yao's code against its models "
                                    "(experiments/qiu_yao_agreement)",
                                    qiu_yao_agreement_table),
    "AuditQiuYaoClamp": Passage("docs/audit.md: the released fix's collapse (repro_qiu_yao)",
                                qiu_yao_clamp_audit),
    "AuditTutorial": Passage("docs/audit.md: the Triton tutorial's forward against its model "
                             "(experiments/triton_tutorial_forward)", tutorial_docs),
    "AuditTutorialInShort": Passage("docs/audit.md: the same, in short", tutorial_readme),
    "AuditTutorialBackward": Passage("docs/audit.md: the tutorial's backward against its "
                                     "model (experiments/triton_tutorial_backward)",
                                     tutorial_backward_docs),
    "AuditTutorialBackwardInShort": Passage("docs/audit.md: the same, in short",
                                            tutorial_backward_readme),
    "AuditKernels": Passage("docs/audit.md: experiments/kernel_audit", kernel_audit_docs),
    "ReadmeKernelTable": Passage("README.md: experiments/kernel_table", kernel_table_readme),
    "AuditKernelTable": Passage("docs/audit.md: experiments/kernel_table", kernel_table_docs),
    "AuditInShort": Passage("docs/audit.md: the audit's findings", audit_readme),
    "AuditBackwardTable": Passage("docs/audit.md: experiments/kernel_audit_backward",
                                  backward_table),
    "AuditBackwardFindings": Passage("docs/audit.md: the gradient audit's findings",
                                     backward_findings),
    "AuditPorts": Passage("docs/audit.md: the diagnosed ports (experiments/audit_ports)",
                          ports),
    "AuditTorchDiagnosis": Passage("docs/audit.md: torch_sdpa's closest models",
                                   torch_diagnosis),
    "AuditTorchCpuBackward": Passage("docs/audit.md: the torch_cpu backward against torch's "
                                     "(experiments/torch_cpu_backward)",
                                     torch_cpu_backward_docs),
    "AuditTorchCpuBackwardInShort": Passage("docs/audit.md: the same, in short",
                                      torch_cpu_backward_readme),
}
