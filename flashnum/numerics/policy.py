"""Sites and policies: which format each value of the algorithm is rounded to.

A *site* is a place where attention rounds a value. A *policy* gives every site a
format (a name from `flashnum.numerics.formats`). The engine rounds at exactly these
places and nowhere else; everything between two sites is computed in the
float64 carrier (or, for fp32 accumulations, in real fp32 arithmetic).

Sites, in the order the data flows (the FA2 recurrence, Dao 2023), as FORWARD_SITES below
declares them (the one declaration: Policy's fields, the presets and this list follow it):

{sites}

`l_from` says whether l sums P as computed (FA2, Triton: "p") or the P that
enters P @ V ("p_cast"), so that l and P @ V see the same P.

`structure` says which algorithm the formats feed: "flash" (the blocked online
softmax) or "standard" (S materialised, softmax normalised, then P @ V: what
FlashAttention-3 calls standard attention).

Presets (`make_policy(name, precision)`):

    fa2    FlashAttention-2 and Triton's fused-attention tutorial: Q, K, V in the
           precision; fp32 dots, logits, max, exponentials, l and o; l summed from
           the fp32 P, then P cast to the input dtype for P @ V (`p.to(v.dtype)`
           before `tl.dot(p, v, acc)`); o / l in fp32; output cast to the dtype.
    naive  standard attention in the precision (FlashAttention-3's baseline,
           torch `softmax(q @ k.T * scale) @ v` in fp16/bf16): S rounded to the
           dtype; softmax computed in fp32 internally and its normalised result
           rounded to the dtype; P @ V accumulated in fp32, output rounded.
    lowp   every storage site in the precision, as in pure-PyTorch ports of FA2
           (Qiu & Yao's attention.py): matmuls and sums accumulate in fp32 (what
           torch does for bf16 on CPU and GPU) but m, P, l, o and every
           elementwise update are rounded to the dtype.
    exact  no rounding anywhere (the precision only names the inputs' origin):
           isolates the algorithm from the arithmetic.
    uniform  every site in the precision, the dots' accumulations included (what a
           machine with only that one format would do; Higham's model of the algorithm);
           the product sites stay exact: its narrow accumulator rounds each product.

Precision `p<bits>` (2 <= p <= 52: a p-bit significand with fp32's exponent range, the
precision_bits studies) takes a preset's bf16 sites to p bits (fa2: the inputs, P
before P @ V and the output; the fp32 softmax state stays); `uniform` puts every site in it.

For precision 'tf32' the presets mean fp32 tensors with tf32 dots. For fp8 the
output is bf16 (FlashAttention-3's fp8 forward writes bf16).
"""

from __future__ import annotations

import textwrap
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field, fields, make_dataclass, replace

from flashnum.numerics.formats import FORMAT_NAMES, PRECISIONS, get_format


@dataclass(frozen=True)
class Site:
    """One place where attention rounds a value: its name, what it holds, and its format in
    the presets fa2, naive and lowp as a role: "x" the precision's tensors, "dot" the dots'
    accumulator, "wide" the softmax state (fp32; fp64 in fp64), "out" the output format,
    "none" no rounding (exact; a product site that only a kernel's model sets),
    "fwd" (backward sites) the forward policy's format at the site of the same name."""

    name: str
    holds: str
    fa2: str
    naive: str
    lowp: str


# The forward's sites, the one declaration of them: Policy's fields (in this order), the
# presets (make_policy), the list in this module's docstring and docs/architecture.md's
# (tests/test_sites.py) all come from it. A new site is a line here, its rounding where
# the engine computes the value (flashnum.engine.recurrence), its term in the bound.
FORWARD_SITES = (
    Site("inputs", "Q, K, V as stored in memory", "x", "x", "x"),
    Site("qk_product", "each product q_it k_jt of S = Q K^T, rounded before it is summed "
         "(tinygrad's bf16 dot: the product in the dtype, the sum in fp32); exact in every "
         "preset: the dot is one FMA chain", "none", "none", "none"),
    Site("qk_acc", "accumulation of the dot S = Q K^T ('tf32': operands rounded to tf32, "
         "products summed in fp32, as tensor cores do)", "dot", "dot", "dot"),
    Site("s", "logits: the scaled dot scale * QK^T, and s - m before the exponential",
         "wide", "x", "x"),
    Site("m", "running row max m_i (max is exact; rounding matters only when m is narrower "
         "than s)", "wide", "wide", "x"),
    Site("p", "exponentials P = exp(s - m) and the rescale alpha = exp(m_old - m_new)",
         "wide", "wide", "x"),
    Site("p_cast", "P as it enters P @ V (FA2 casts P to the input dtype here)", "x", "x", "x"),
    Site("pv_product", "each product p_ij v_jc of P @ V, rounded before it is summed "
         "(exact in every preset)", "none", "none", "none"),
    Site("pv_acc", "accumulation of the dot P @ V", "dot", "dot", "dot"),
    Site("l_acc", "accumulation of the block row sum rowsum(P)", "wide", "wide", "wide"),
    Site("l", "the running normaliser l_i = l_{i-1} alpha + rowsum(P), and each block's "
         "rowsum(P) as stored before it is added", "wide", "wide", "x"),
    Site("o", "the accumulator o_i = o_{i-1} alpha + P V, and each block's P V tile as "
         "stored before it is added", "wide", "wide", "x"),
    Site("div", "the final division o / l", "wide", "wide", "x"),
    Site("out", "the output as stored", "out", "out", "out"),
)
SITES = tuple(site.name for site in FORWARD_SITES)
# the sites of a product rounded before its sum: exact ("no rounding") unless a policy sets
# them, so that every preset's dots stay one FMA chain (and every stored table its bits)
PRODUCT_SITES = tuple(site.name for site in FORWARD_SITES if site.fa2 == "none")
STRUCTURES = ("flash", "standard")
PRESETS = ("fa2", "naive", "lowp", "exact")
POLICIES = PRESETS + ("uniform",)  # every policy name make_policy (and the config) accepts


def site_list(sites=FORWARD_SITES, indent: int = 4) -> str:
    """The declared sites as a list: `name  what it holds`, wrapped at 88 columns."""
    pad, w = " " * indent, max(8, *(len(x.name) + 1 for x in sites))
    return "\n".join(textwrap.fill(f"{x.name:{w}s} {x.holds}", 88, initial_indent=pad,
                                    subsequent_indent=pad + " " * (w + 1)) for x in sites)


def check_sites(pol, supported: Mapping[str, Collection[str]], where: str,
                hint: str = "") -> None:
    """The one refusal of a path that rounds some sites only into some formats: `supported`
    maps a site to the formats the path implements there (a site not named: any format).
    Raises one ValueError naming every site it cannot honour and what it can, then `hint`
    (e.g. which presets run there)."""
    bad = [f"{site}={getattr(pol, site)!r}" for site, ok in supported.items()
           if getattr(pol, site) not in ok]
    if bad:
        can = "; ".join(f"{site} {'/'.join(ok)}" for site, ok in supported.items())
        raise ValueError(f"policy {pol.name!r} cannot run on {where} ({', '.join(bad)}); "
                         f"it implements {can}" + (f": {hint}" if hint else ""))


def _policy_fields(sites, extra) -> list:
    """The dataclass fields of a policy: one format name per declared site ("exact" by
    default), then `extra` (name, type, default)."""
    return [(x.name, str, field(default="exact")) for x in sites] + [
        (n, t, field(default=d)) for n, t, d in extra]


def check_formats(policy, sites, kind: str) -> None:
    """Every site of a policy names a format; one line naming the first that does not."""
    for site in sites:
        f = getattr(policy, site)
        try:
            get_format(f)
        except ValueError:
            raise ValueError(f"{kind} site {site}={f!r} is not a format; valid: "
                             f"{', '.join(FORMAT_NAMES)}") from None


class _PolicyRules:
    """What a Policy does with its fields (the fields come from FORWARD_SITES)."""

    def __post_init__(self):
        check_formats(self, SITES, "policy")
        if self.l_from not in ("p", "p_cast"):
            raise ValueError(f"unknown l_from {self.l_from!r}; valid: p, p_cast")
        if self.structure not in STRUCTURES:
            raise ValueError(
                f"unknown structure {self.structure!r}; valid: {', '.join(STRUCTURES)}"
            )

    def fmt(self, site: str):
        """The Format object of a site."""
        return get_format(getattr(self, site))

    def with_sites(self, **sites) -> Policy:
        """A copy with some sites changed (name becomes 'custom' unless given)."""
        sites.setdefault("name", "custom")
        return replace(self, **sites)

    def only(self, site: str) -> Policy:
        """This policy with every site but `site` exact (for error attribution)."""
        kw = {s: "exact" for s in SITES if s != site}
        return replace(self, name=f"{self.name}[only {site}]", **kw)

    def without(self, site: str) -> Policy:
        """This policy with `site` exact and every other site as it is."""
        return replace(self, name=f"{self.name}[no {site}]", **{site: "exact"})

    def sites(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in SITES}

    def asdict(self) -> dict:
        return asdict(self)


Policy = make_dataclass(
    "Policy", _policy_fields(FORWARD_SITES, [
        ("structure", str, "flash"),
        ("l_from", str, "p"),  # l sums P as computed ("p", FA2/Triton) or as cast ("p_cast")
        ("name", str, "custom")]),
    bases=(_PolicyRules,), frozen=True)
Policy.__module__ = __name__
Policy.__doc__ = ("A format name for every site (FORWARD_SITES), the structure, l_from and a "
                  "name. `Policy(**{site: 'bf16', ...})`.")


def is_pbits(precision) -> bool:
    """True for a p<bits> precision name (p11: an 11-bit significand, fp32's range)."""
    return isinstance(precision, str) and precision[:1] == "p" and precision[1:].isdigit()


def check_precision(precision, mp: bool = False) -> str:
    """A precision a policy may be built in (PRECISIONS, p<bits>); mp=True admits mp too."""
    ok = precision in PRECISIONS and (mp or precision != "mp")
    if not ok and is_pbits(precision):
        ok = 2 <= int(precision[1:]) <= 52
    if not ok:
        valid = ", ".join(p for p in PRECISIONS if mp or p != "mp")
        raise ValueError(f"unknown precision {precision!r}; valid: {valid}, or p<bits> (2..52)")
    return precision


def make_policy(name: str | Policy, precision: str = "bf16") -> Policy:
    """The policy `name` (fa2 naive lowp exact uniform, see POLICIES) in `precision`."""
    if isinstance(name, Policy):
        return name
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; valid: {', '.join(POLICIES)}")
    check_precision(precision)
    if name == "uniform":  # its narrow dots round each product already (the accumulator)
        return Policy(name="uniform", **{site: precision for site in SITES
                                         if site not in PRODUCT_SITES})
    if is_pbits(precision):  # the preset's bf16 sites at p bits, the rest as in bf16
        tpl = _preset(name, "bf16")
        return tpl.with_sites(
            name=tpl.name, **{s: precision for s, f in tpl.sites().items() if f == "bf16"}
        )
    return _preset(name, precision)


def _preset(name: str, precision: str) -> Policy:
    """One of PRESETS in a precision of PRECISIONS (checked by make_policy)."""
    x = precision
    dot = "fp32"
    if precision == "tf32":
        x, dot = "fp32", "tf32"  # fp32 tensors, tensor-core tf32 dots
    if precision == "fp64":
        dot = "fp64"
    out = "bf16" if precision.startswith("fp8") else x
    wide = "fp64" if precision == "fp64" else "fp32"  # fp32 softmax state, fp64 in fp64
    if name == "exact":
        return Policy(name="exact")
    # each site's role in the preset (FORWARD_SITES); lowp: reductions accumulate in fp32,
    # every stored value is in the dtype; naive: the standard structure
    role = dict(x=x, dot=dot, wide=wide, out=out, none="exact")
    return Policy(**{site.name: role[getattr(site, name)] for site in FORWARD_SITES},
                  name=name, **({"structure": "standard"} if name == "naive" else {}))


# ---------------------------------------------------------------------------
# the backward pass (FlashAttention-2, Dao 2023, Algorithm 2)
#
# Sites of the backward, in the order the data flows (flashnum.engine.backward): BWD_SITES
# below, the one declaration (BackwardPolicy's fields, the backward presets).
#
# `structure` "flash": Algorithm 2 (P recomputed from the stored LSE, D from dO and O,
# scale applied to the fp32 accumulators at the end); "standard": autograd of
# softmax(scale Q K^T) V (P is the forward's stored softmax output, computed with
# the forward policy's sites; lse, qk_acc, s, p, p_cast of this policy are then unused).

BACKWARD_SITES = (
    Site("lse", "the stored log-sum-exp of each row, L = m + log l (P = exp(S - L))",
         "wide", "wide", "x"),
    Site("do", "dO as stored in memory", "x", "x", "x"),
    Site("qk_acc", "accumulation of the recomputed S = Q K^T", "dot", "dot", "dot"),
    Site("s", "the recomputed logits scale * QK^T, and S - L before the exponential",
         "wide", "fwd", "x"),
    Site("p", "the recomputed P = exp(S - L)", "wide", "fwd", "x"),
    Site("p_cast", "P as it enters P^T dO (FA2 and the Triton tutorial cast it to the input "
         "dtype)", "x", "fwd", "x"),
    Site("dv_acc", "accumulation of a tile's P^T dO", "dot", "dot", "dot"),
    Site("dv", "the dV accumulator across query blocks (each tile stored before it is added)",
         "wide", "wide", "x"),
    Site("dp_acc", "accumulation of dP = dO V^T", "dot", "dot", "dot"),
    Site("dp", "dP as stored (autograd stores it in the dtype; kernels keep fp32)",
         "wide", "x", "x"),
    Site("delta", "D = rowsum(dO * O) (flash) or rowsum(P * dP) (autograd's softmax "
         "backward), summed in fp32 or wider, stored in this format", "wide", "wide", "x"),
    Site("ds", "dS = P * (dP - D): the difference and the product", "wide", "wide", "x"),
    Site("ds_cast", "dS as it enters the dS^T Q and dS K GEMMs (the input dtype in FA2); in "
         "the standard structure also dS * scale (autograd's backward of the scaling)",
         "x", "x", "x"),
    Site("dk_acc", "accumulation of a tile's dS^T Q", "dot", "dot", "dot"),
    Site("dk", "the dK accumulator across query blocks, and dK * scale", "wide", "wide", "x"),
    Site("dq_acc", "accumulation of a tile's dS K", "dot", "dot", "dot"),
    Site("dq", "the dQ accumulator across key blocks (atomic adds in flash-attn), and "
         "dQ * scale", "wide", "wide", "x"),
    Site("out", "dQ, dK, dV as stored (the output format)", "out", "out", "out"),
)
BWD_SITES = tuple(site.name for site in BACKWARD_SITES)


class _BackwardRules:
    """What a BackwardPolicy does with its fields (the fields come from BACKWARD_SITES)."""

    def __post_init__(self):
        check_formats(self, BWD_SITES, "backward policy")
        if self.structure not in STRUCTURES:
            raise ValueError(
                f"unknown structure {self.structure!r}; valid: {', '.join(STRUCTURES)}"
            )
        if not isinstance(self.forward, Policy):
            raise TypeError(f"forward must be a Policy, got {type(self.forward).__name__}")

    def fmt(self, site: str):
        return get_format(getattr(self, site))

    def sites(self) -> dict[str, str]:
        return {s: getattr(self, s) for s in BWD_SITES}

    def with_sites(self, **sites) -> BackwardPolicy:
        sites.setdefault("name", "custom")
        return replace(self, **sites)

    def only(self, site: str) -> BackwardPolicy:
        """Only backward site `site` rounds (every other site, the forward's included, exact)."""
        if site not in BWD_SITES:
            raise ValueError(f"unknown backward site {site!r}; valid: {', '.join(BWD_SITES)}")
        kw = {s: "exact" for s in BWD_SITES if s != site}
        return replace(self, name=f"{self.name}[only {site}]", forward=Policy(name="exact"), **kw)

    def asdict(self) -> dict:
        d = {s: getattr(self, s) for s in BWD_SITES}
        d.update(structure=self.structure, name=self.name, forward=self.forward.asdict())
        return d


BackwardPolicy = make_dataclass(
    "BackwardPolicy", _policy_fields(BACKWARD_SITES, [
        ("structure", str, "flash"), ("forward", Policy, Policy(name="exact")),
        ("name", str, "custom")]),
    bases=(_BackwardRules,), frozen=True)
BackwardPolicy.__module__ = __name__
BackwardPolicy.__doc__ = ("A format for every backward site (BACKWARD_SITES) and the forward "
                          "policy it follows.")


def make_backward_policy(name: str | BackwardPolicy, precision: str = "bf16") -> BackwardPolicy:
    """The backward preset `name` ('fa2', 'naive', 'lowp', 'exact') in `precision`; its
    forward is make_policy(name, precision). See flashnum.engine.backward for what each models."""
    if isinstance(name, BackwardPolicy):
        return name
    if name not in PRESETS:
        raise ValueError(f"unknown backward policy {name!r}; valid: {', '.join(PRESETS)}")
    fwd = make_policy(name, precision)  # validates the precision
    if name == "exact":
        return BackwardPolicy(forward=fwd, name="exact")
    # each site's role (BACKWARD_SITES): wide is fp32 (fp64 in fp64) in fa2 and naive;
    # lowp: every stored value and every accumulator across blocks in the dtype
    role = dict(x=fwd.inputs, out=fwd.out, dot=fwd.qk_acc, wide=fwd.l)
    return BackwardPolicy(
        **{x.name: role[r] if r != "fwd" else getattr(fwd, x.name)
           for x in BACKWARD_SITES for r in (getattr(x, name),)},
        forward=fwd, name=name, **({"structure": "standard"} if name == "naive" else {}))


__doc__ = __doc__.replace("{sites}", site_list(FORWARD_SITES))
