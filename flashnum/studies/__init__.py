"""The research tables that are not reproductions of a published result, one module per
topic; conf/table/NAME.yaml names the function that computes each (`module:function`),
flashnum.harness.tables runs it and the store keeps it under experiments/NAME/.

    kernel_agreement  models of real kernels against the kernels, bit for bit: torch's CPU
                      SDPA forward and backward, the Triton tutorial, Triton's interpreter
    bounds            the a-priori bound: its stress test and its tightness
    attribution       where the error comes from: the attribution grid, the backward's sites
    exp_exhaustive    the exp site on every float32 argument
    head_stats        the logit statistics of every input of a forward experiment
    input_transforms  K smoothing and the Hadamard rotation on low-precision inputs

The tables about a published result sit beside its reproduction (flashnum.reproduce.fa3,
flashnum.reproduce.qiu_yao_bias). A study imports the harness and the store, never the
reverse.
"""
