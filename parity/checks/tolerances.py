"""Every numerical bound the suite applies, in one place.

A subject's value is compared with the float64 oracle (the same reference model and data, the
same initial weights, no rounding after them). The bound for that error is

    bound = SHARDING_SLACK * reference_error + FLOOR_ULPS * unit_roundoff(dtype) * max|oracle|

- reference_error = max|reference at the case dtype - oracle|: the error an *unsharded* run at
  this precision makes. Sharding changes reduction order (a vocab split changes the softmax
  denominator's summation, the all-reduce sums partial products in another order), so a correct
  sharded run makes an error of the same size but in different places; SHARDING_SLACK allows for
  that. This scales the bound with depth, steps and precision without a hand-tuned table.
- The floor covers quantities that the reference computes exactly (reference_error == 0) but a
  sharded run computes through a different summation order: a few rounding units of the
  largest magnitude involved (errors in a sum are bounded relative to its terms, not its result).

Checks that involve no arithmetic are exact (bound 0): initial shard slices, replicated tensors
agreeing across ranks, and the SGD identity w' = w - lr * g in float32. In bf16/fp16 the SGD
identity is checked against one rounding unit of the weight, since the update goes through
float32 master weights and one cast back; with gradient clipping, one unit more for the rounded
clip coefficient.

Beside that max criterion, two criteria that look at elements (issue 15), on tensors large
enough for their statistics (ELEMENTWISE_MIN_SIZE):

- RMS: rms(x - oracle) <= RMS_SLACK * min(e, r1) + SHARDING_SLACK * max(e - r1, 0)
                          + RMS_FLOOR_ULPS * u * rms(oracle),
  e = rms(ref - oracle), r1 = ONE_ROUNDING_RMS * u * rms(oracle) (one rounding of every value).
  A systematic error (a scale, a lost bit of precision) moves every element; the RMS of a correct
  run's error is that of the reference's to within a small factor where both are sums of many
  independent roundings (a law-of-large-numbers estimate, so only on many elements): the final
  rounding of each value is, so that part keeps RMS_SLACK. What the reference's error holds beyond
  one rounding it inherited from upstream (five bf16 SGD steps' drift, the logits' rounding passed
  on through the loss gradient): a few shared quantities' errors spread over every entry, one
  realisation of a few-source error like the max criterion's, so it gets SHARDING_SLACK. Measured
  with RMS_SLACK on all of it, on correct subjects at seeds 1-4 on two CPUs: a trained bf16 tied
  head's input gradient (reference 2.05 units of u rms(oracle), subject 5.13), vocabulary-2
  RMSNorm/head gradients (3.7-3.9 units, subjects 9.4-11): 1.01-1.3 of the bound, each within the
  rounding samples' range. This is what catches a relative scale of a few unit roundoffs, which the
  max criterion's floor hides; the stage-local checks below start from exact inputs, so their
  reference's error is all the stage's own independent roundings, held to RMS_SLACK: they catch a
  scale where the end-to-end error is mostly inherited.
- element-wise: |x_i - oracle_i| <= ELEMENT_SLACK * (|ref_i - oracle_i| + rms(ref - oracle))
                                    + ELEMENT_FLOOR_ULPS * u * |oracle_i|.
  Each element against its own magnitude and its own reference error: a corrupted small entry no
  longer hides under the largest one. rms(ref - oracle) is the element's neighbourhood: a correct
  run may round an element the reference happened to get exactly (|ref_i - oracle_i| = 0), or one
  that cancels (|oracle_i| ~ 0, while the rounding is relative to the terms of its sum, whose
  size the reference's typical error measures); ELEMENT_SLACK is wide because it is a maximum over
  every element of a ratio of two rounding errors. (The typical *error*, not the typical value:
  rms(oracle) would let an entry a hundred times smaller than the typical one be anything.)

A tensor of fewer than ELEMENTWISE_MIN_SIZE elements is judged by the max criterion alone, and there
max|ref - oracle| is the error of a handful of elements in one run. At tiny shapes (vocab 2-4,
hidden 2, found by `parity explore`) every entry can be a cancelling sum (a bias gradient sums p -
onehot over tokens; a 2-row head's input gradient is w0 d0 + w1 d1 with d1 ~ -d0): its rounding
error is relative to the sum's terms, which neither max|oracle| (the floor) nor the reference's one
error measures; the reference may round it almost exactly while a sharded run, whose partial sums
are rounded before the all-reduce, makes the error the terms allow (measured: 1.05-1.84 of the bound
on correct subjects, whose largest error was 6-9 times the reference's). Such a tensor, when it
misses that bound, gets a second estimate of the reference error: the largest error of
ROUNDING_SAMPLES reruns of the case-dtype reference with every rounding moved by up to one unit of
its dtype (Monte Carlo arithmetic, parity/checks/rounding.py). Where that sampled error exceeds the
floor itself (FLOOR_ULPS units of max|oracle|), the floor's premise, that max|oracle| is the largest
magnitude involved, is disproved for this tensor: its entries are cancelling sums. Then, and only
then, the bound is SHARDING_SLACK x max(reference_error, sampled_error) + the same floor. (Without
that condition, the samples also widened small tensors at the default shapes that do not cancel,
where the reference's one error happened to be small: a bf16 fused-CE per-token loss, 24 entries,
caught a planted scale error from 0.091 instead of 0.070.) Why eight: the max of eight independent
samples of a roughly Gaussian rounding error falls below a quarter of its standard deviation with
probability 0.2^8 ~ 3e-6, so the estimate is not itself a lucky one. Only for a tensor that misses
its first bound, and only below ELEMENTWISE_MIN_SIZE: the samples can only widen a bound, so a
tensor that passes has the same verdict whether they were taken or not (its ratio is reported
against the first bound), each sample costs one reference run under a Python dispatch mode
(seconds).

A tensor of 32 elements or more keeps its max bound, whose max of many elements' errors is a stable
estimate; its RMS and element-wise bounds get the samples in the same way: when the RMS misses
RMS_SLACK x rms(ref - oracle) by at most RMS_SAMPLED_REACH (further only where they are dispersed,
below), the samples' RMS error is taken, and
where it exceeds both the reference's and FLOOR_ULPS units of rms(oracle) (the premise of the RMS,
many independent roundings each relative to its own value, is then disproved: the entries inherit
the errors of a few cancelling sums), the bound is RMS_SLACK x the samples' RMS + the same floor.
The samples test the premise a second way, by dispersion: where their eight RMS errors spread by
more than DISPERSED_SPREAD (fewer than MIN_RMS_SOURCES independent roundings make the error, so one
run's RMS does not stand for another's), the bound is RMS_SLACK x the largest sample's RMS + the
floor. Found in 5 seeds on the H200 host's Xeon and this VM's EPYC: vocabulary-269 bias gradients
over tp 3/4 in fp32, each entry a sum of p - onehot over a dozen tokens, where the reference's RMS
error was 0.3 units and the samples' 0.45-3.3 (a correct subject 1.64, 1.03-1.1 of RMS_SLACK x the
reference's). Neither widening looks at the subject: both are properties of the computation.
Eight samples' range estimates that spread with a relative noise of about 29% (d3 / d2 of the
control-chart tables for n = 8), while how many roundings make a tensor's error is a property of its
computation, the same at every step: so the spread is also taken over the record's whole trajectory,
as the geometric mean of its steps' spreads (this step's included), and either over DISPERSED_SPREAD
disperses. The bound stays this step's largest sample's. Found by `parity explore --seed 0`
(hf_plan_row bf16, vocabulary 2): a k_proj weight-gradient shard at step 1, the reference 1.96 units
of u rms(oracle), a correct subject 8.6 (1.12x), this step's samples 2.6-6.4 (spread 2.46) while the
same record's five steps spread 2.5-4.9 (geometric mean 3.8) and the reference's own error at the
five steps ranged over 1.8-24.6 units: a few-source error; now 0.62 of the widened bound.
Found by `parity explore` at vocab 2 (the q_proj/k_proj weight gradients of the HF tp_plan subjects,
512 entries from a 2-row head's input gradient: the reference's RMS error varied 2.5x between steps,
the subject's was up to 3.2x it) and on the H200 host's Xeon at vocab 34 (1.09x; not re-run there).
Measured at vocab 2 (hf_plan_row, step 2): the reference's RMS error 8 units of rms(oracle), the
samples' 52, the subject's 2.15x the reference's (now 0.37 of its bound, the element criterion the
worst); a rounding of the values themselves is about one unit. A bf16 tensor that does not cancel
has samples near one unit, so the gate keeps its RMS bound, and the detection thresholds measured on
it, as they were. An element that misses its bound, in a tensor whose samples pass the same gate, is
held to the samples' errors instead of the reference's (its own and the RMS of its neighbourhood):
found by `parity explore --seed 8` (hf_plan_tied vocab 2, a q_proj weight-gradient entry at 1.37x
after the RMS had been mended), and in 5 seeds of the default matrix on the H200 host's Xeon
(hf_plan_row/column vocab 2, k_proj 1.2-1.4x).

A reference that rounded luckily: both gates ask whether the samples disprove a premise by size or
spread; neither asks whether the reference's own RMS error is a representative draw. Where every
sample's RMS exceeds what a sample gives values rounded once (MCA_ONE_ROUNDING x ONE_ROUNDING_RMS u
rms(oracle)) while the reference's lies below one rounding and below every sample's over SAMPLES_WIDTH
(what Monte Carlo arithmetic's wider moves give a round-to-nearest run), the computation errs beyond one
rounding of its values (a few cancelling sums) and the reference did not show it: a lucky draw. Then the
smallest sample over SAMPLES_WIDTH stands for the reference's RMS error, in the RMS bound (rms_bound, the
same formula) and as the element criterion's neighbourhood. (Until 2026-12-04 the gate asked the samples
over SAMPLES_WIDTH to exceed one rounding, i.e. 2 one-roundings raw; see MCA_ONE_ROUNDING for why 1.5,
and results/sensitivity/mca-one-rounding/ for what it moved.)
Found by `parity explore --seed 10`: a direct_vocab_parallel fp32 vocabulary-177 bias gradient (88
entries of p - onehot sums over a dozen tokens), the reference 0.71 one-roundings, the stand-in 1.14, a
correct subject at 1.04x of the bound; and seed 1's torch_column_gathered vocabulary-174 stage-local bias
(tp 3, 58 entries): reference 0.38, stand-in 1.33, 1.05x. Both sides of one rounding are needed (measured
with `parity sensitivity` on the bf16 cases of the selection below): without the first, bf16 weights that
the reference rounds almost exactly (0.05-0.1 one-roundings; the samples, moving each cast by up to a
unit, 1.1) widened the bf16 weight thresholds by 15-28%; without the second, bf16 stage gradients whose
reference errs by 1.2-1.5 one-roundings and whose samples run about 2.3 times that. Like the gates it
looks at the reference and the samples, never at the subject, and only after a miss.

An inherited error's lucky draw: an end-to-end check's reference errs beyond one rounding by what it
inherited from upstream (earlier steps' drift), one realisation of a few-source error, held to
SHARDING_SLACK. That realisation can itself be a lucky one while the reference still errs by a little
more than one rounding: where the reference's RMS error lies below every sample's over SAMPLES_WIDTH (and
the samples exceed what one rounding gives them), the smallest of them stands in, as above. End to end only: a stage-local
reference's error is the stage's own many independent roundings, a representative draw (there the bf16
stage gradients above, 1.2-1.5 one-roundings with samples about 2.3 times that, keep their bound). The
widening is the gap between the reference and the samples' smallest, which is small where many roundings
make the error (the samples agree) and large only where few do. Found by `parity explore --seed 0`
(torch_vocab_embedding tied, bf16, summed loss, vocabulary 3 over tp 3, one table row per rank): the
logits at step 3 (36 entries, at most nine distinct products of three rows), the reference 1.06
one-roundings, its samples over SAMPLES_WIDTH 1.58-3.7, a correct subject 5.25 (1.32x; 0.87 of the
stand-in bound), and a one-row shard of the embedding gradient, the reference 2.0, samples 3.04-5.92, the
subject 9.14 (1.18x; 0.77). The same case at seeds 1-9: the subject's RMS error 2.8-5 times the
reference's at every seed (its tp partial sums rounded to bf16 before the all-reduce), the worst check
at 0.6-0.94 of the first bound.

Few sources: the dispersion test says when fewer than MIN_RMS_SOURCES roundings make a tensor's error;
between that and the many RMS_SLACK assumes, one run's RMS error stands for another's only within a
factor the number of sources sets. A one-row shard of a head's weight gradient (63 entries, each a sum
over a dozen tokens of dz x) shares the tokens' dz errors across its entries: about six sources by its
samples' spread, and then the log of the ratio of two runs' RMS errors has a standard deviation of about
0.41, so RMS_SLACK = 2 is 1.7 of them. The samples measure that spread for the tensor at hand: where
their log RMS errors' standard deviation (pooled over the record's steps where known) calls for a slack
above RMS_SLACK at FEW_SOURCE_Z standard deviations of a ratio, a tensor that missed its RMS bound, and
that neither the magnitude, dispersion nor lucky-reference gate widened, gets that slack in the same
formula (rms_bound). Only a stage-local check: its reference and the subject start from the same exact
inputs and share no rounding, independent draws as the samples are; end to end they share every upstream
rounding, so their ratio varies less than the samples' spread says, and the inherited part has
SHARDING_SLACK already (measured with `parity sensitivity` on the 24 cases below: applied end to end
too, the bf16 weight-gradient scale threshold rose from 0.0087 to 0.0103, over its 0.01 target). Found
by `parity explore --seed 0` (vocab_parallel fp32, num_items, vocabulary 4 over tp 3): the stage-local
head-gradient shard of one row, the stage reference 2.02 units of u rms(oracle), its samples 2.48-5.67,
a correct subject 5.95 (1.18x; the same case at seeds 1-7 reached 0.52-0.92, the subject 1.4-2.9 times
the reference); the samples' slack 3.07, the check at 0.83 of it. Like the other gates it looks at the
samples, never at the subject, and only after a miss.

A row's neighbourhood: where a tensor's rows are separate computations of different sizes, an element
that misses its bound in a tensor of two or more dimensions is held to its row's (last axis') RMS
reference error where that exceeds the tensor's. A tied embedding's gradient adds, to the head's
gradient, the lookups' gradients of the rows the step's tokens looked up: a row looked up several times
sums far larger terms than one looked up never, and its error is that much larger, whatever the
element's own magnitude (a token's row of the head-input gradient likewise scales with that token's dz).
Found by `parity explore --seed 3` (tied_vocab_parallel bf16, vocabulary 193, hidden 61, padding row 0,
ZeRO 3, tp 3): the reference's row RMS errors on the rank's 61 x 61 shard ranged from 3.6e-6 (median) to
7.3e-4 (row 27, which holds the shard's largest entry) against 1.3e-4 over the whole shard; at (27, 50)
the reference erred by 2.1e-5 (a lucky element: its eight samples 2.1e-5 to 4.6e-3, three beyond
2.7e-3), a correct subject by 2.79e-3: 1.13x of the tensor's neighbourhood, 0.23 of the row's. It looks
at the reference, never at the subject, and only after a miss. Its cost, measured with `parity
sensitivity` (results/sensitivity/few-source-rows/): the one-element thresholds of 2-D tensors rose by
up to 1.49x (bf16) and 1.62x (fp32, a head-input gradient), the scale thresholds not at all.

The max criterion of a few-source tensor: a tensor of ELEMENTWISE_MIN_SIZE elements or more keeps its max
bound because the largest of many elements' errors is a stable estimate; where the samples are dispersed
(the entries share fewer than MIN_RMS_SOURCES sources), they disprove that too, and a missed max bound
takes the samples' largest error as the reference's (SHARDING_SLACK x it + the same floor). Not on the
magnitude gate: a bf16 fused-CE per-token loss (independent tokens, a float32 floor its bf16 samples
exceed) then caught a planted one-element error from 0.034 instead of 0.0099 (`parity sensitivity`). Found by `parity explore --seed 0` (torch_vocab_embedding tied, fp32, vocabulary 3 over tp 3):
a one-row, 42-entry shard of the embedding gradient at step 4, the reference 5.2e-8 at most, its eight
samples 1.0e-7 to 7.2e-7 (their RMS errors spread 7.4: dispersed), a correct subject 7.7e-7 (2.4x of the
first bound, 0.26 of the sampled one).

A shard smaller than ELEMENTWISE_MIN_SIZE whose own samples stay under its floor is gated by its whole
tensor's samples and floor too (where the samples hold the whole tensor): whether the entries are
cancelling sums is the tensor's property, and a shard of one entry can hold the one the reference
rounded almost exactly. Found by `parity explore
--seed 13`: vocab_parallel fp32, vocabulary 2 over tp 2, dp 2, a one-entry bias shard whose oracle
-0.02896 sums terms up to about 1; the reference erred by 2.3e-10, the samples up to 2.44e-8 on it (under
the floor, 2.76e-8) and 3.75e-8 on the other entry, a correct subject 3.7e-8 (1.30x). The bound is still
the shard's own: SHARDING_SLACK x its samples' largest error + its floor.

u is the unit roundoff of the *floor dtype*: the least precise rounding on the path from the
reference's exact inputs to that tensor (references.trajectory.Trajectory.floor_dtypes): the case
dtype for everything a training step produces (logits are rounded to it and everything downstream
inherits that), float32 for a loss the reference computes in float32 from exact case-dtype logits
(the loss-only subjects, and the stage-local loss below), and for the fused linear CE's float32 loss,
whose bf16/fp16 logits are each rounded once whatever the split (an independent error per logit, which
the reference's own error measures; references/cross_entropy.py: linear_ce_reference).

Stage-local oracles (parity/checks/stages.py): a stage re-evaluated in float64 on the *subject's
own* inputs to it (its recorded logits and targets -> loss; logits and head weight -> head-input
gradient; head input and weight -> logits; logits gradient and head input -> the head's step gradient,
for a tied head on the rows the step's lookups leave alone; an embedding's lookup -> its loss),
against the same stage at the case dtype done the reference's way on those inputs.
No upstream rounding is inherited, so the bound is the stage's own arithmetic: the same three
criteria, with the stage reference's error and the floor of the dtype the stage computes in.

A stage's RMS floor (stage_rms_floor_ulps) is RMS_FLOOR_ULPS units where the stage computes in its
floor dtype (float32: a correct run's other summation order moves its values by units of that dtype,
relative to the sums' terms: vocabulary-269 bias gradients over tp 2-4, each entry a cancelling sum of
p - onehot, reached 0.98 of that bound on a correct subject and failed at the smaller floor below), and
ONE_ROUNDING_RMS units where it rounds to bf16/fp16 results it accumulated in float32 (matmuls, the
softmax's sums, the gradients' reductions, on CPU and GPU alike). There another summation order
moves the float32 accumulator by float32 units, 2^16 (bf16) or 2^13 (fp16) times below the floor
dtype's, and what a correct run can add to a reference that happens to be exact is one rounding of
each value: ONE_ROUNDING_RMS units by definition. (A row-parallel head, whose partial sums are
rounded to the case dtype before the all-reduce, has no logits or head-gradient stage: README
"Tolerances".) A full unit there was twice what it models, and it set the detection threshold of a
subject whose stage error equals the reference's: the fused linear CE's bf16 gradients, bitwise the reference's, caught a scale only from 0.0101-0.0103 (stage
bound 2 x 0.75 + 1 units); with the one-rounding floor, 2 x 0.75 + 0.58. Measured on correct subjects
(the default CPU matrix, seed 0, on the EPYC): the worst bf16 stage RMS check at 0.67 of the smaller
bound (0.51 of the old), fp32's unchanged.

A row's shared rounding: a softmax's log-sum-exp is one value per token, rounded where it is formed (the
log of the sum of exponentials, and that plus the row's max), and every probability of the token
inherits its error: exp(z - lse) moves by the same relative amount across the whole row. In a head's
weight gradient (dz^T x over a dozen tokens) a token with a large head input carries that one error into
every entry of its column, so a few tokens' shared roundings can make most of the tensor's RMS error:
a one-source error, whose size in one run says nothing of its size in another. The rounding samples did
not show it where it was found: their RMS errors spread 1.76 (under the dispersion gate), none reached
the correct subject's, whose error ran with one sign down 20 of its 21 rows in one column. So the
stage-local head-gradient check adds, to its RMS bound, the bound of that part alone: each counted token
t's shared error at most u ((lse_t - m_t) + |lse_t|) (the log's rounding and the add's, each at most u of
its value: lse_shared_error), carried by its probabilities p_tv (times the token's loss scale) and head
input x_th, combined over tokens in quadrature (independent roundings): sqrt(sum_t (p_tv s_t x_th
e_t)^2), its RMS over the shard. Found by `parity explore --seed 0` at a5ba92f: torch_vocab_parallel
(DTensor's loss_parallel, which forms the log-sum-exp from its shards' partial sums) fp32, vocabulary
82 over tp 4, hidden 2: the stage reference 2.84 one-roundings, its samples 4.2-7.4, a correct subject
10.1 (1.27x of the few-source bound), its error in column 0 of one sign on 20 of 21 rows. Ten seeds of
that family (vocabulary 64/82/91/128, hidden 2/8/32, tp 2/4) failed 9 of 120 tp-4 cases at 1.01-1.28x
and none at tp 2, while DTensor's per-token shared error measured no larger than torch's (1.54 and 1.45
units RMS over 300 draws at tp 4). Like the other gates it looks at the logits and the reference, never
at the subject.

A biased head's product: the logits stage's reference is F.linear, which on CPU (and in cuBLAS's bias
epilogue) adds the bias inside one accumulation and rounds once, relative to the logit. Plain PyTorch
written as `x @ w.T + b` (Megatron's ColumnParallelLinear and DeepSpeed's layers among them) rounds the
product to the case dtype first and then the sum: an error of up to half a unit of |x w^T|, which is not
relative to the logit where the bias cancels the product. Both are the user's plain PyTorch, so the
floor's scale for that stage is the larger of |logit| and |x w^T| at each entry (judge_close's
``rounded_at``), the largest value a valid evaluation rounds. Where the bias is small beside the product,
as in every default case, that is |logit| and nothing changes. Found by `parity explore --seed 0` at
ef3f9c5: megatron_vocab_parallel bf16, vocabulary 2 over tp 2, hidden 19, with bias: rank 1's one-row
shard at step 3 held logits of at most 0.0040 where x w^T reached 0.126; Megatron's error 3.8e-4 (0.78
of a bf16 half unit of 0.126) against a floor of 16 units of 0.0040 (1.29x).

A sharded head's partial products: a head sharded along the vocabulary forms its input gradient dz W
as one partial product per shard, each rounded to the case dtype, which the all-reduce then adds. Each
partial's rounding is relative to that partial, and where the shards' partials cancel (dz sums to zero
over the vocabulary, so with one or a few rows a shard and similar rows they do), that is many times the
result. The stage-local head-input-gradient check's floors therefore scale with the larger of |dz W| and
sum over shards of |dz_s W_s| (judge_close's ``rounded_at``, stages.partial_products_magnitude), as the
biased product above; an unsharded or hidden-sharded head keeps |dz W|. Found by `parity explore --seed
0` at d12c6e6: torch_column_gathered (DTensor ColwiseParallel) bf16, reduction none, vocabulary 3 over tp
3 (one row a rank), hidden 3: the RMS check at 1.12x (3.35e-4 against 2.99e-4), 0.93 with the partials.

The constants were measured on the default matrix (`parity run --report DIR` records every
measured/bound ratio in summary.json, `worst_ratio`), not guessed; see README "Tolerances";
`parity sensitivity` measures what they let through (README "Sensitivity").
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from parity.observe.dtypes import DTYPES

SHARDING_SLACK = 4.0
FLOOR_ULPS = 16.0


# Element-wise and RMS criteria (see above); a tensor smaller than this has too few elements for an
# RMS to estimate an error's size: the max criterion alone judges it (a scalar loss).
ELEMENTWISE_MIN_SIZE = 32
RMS_SLACK = 2.0
# A tensor whose RMS misses its bound by more than this factor is judged by the samples only where
# they are dispersed (each sampling is 8 reference reruns, seconds): the misses the other gates explain
# were 1.09-1.6x (see above), and beyond 4x their premises (a reference error within a small factor of
# a correct run's) no longer describe the miss. Dispersed samples say one run's RMS error does not
# stand for another's at all, however far apart (the max criterion's dispersion gate has no reach
# either). Found by a seed sweep (`parity run --seeds 10`) of the torch_vocab_embedding tied fp32
# vocabulary-3 cases of results/explore/torch-embedding-v3-tp3.toml: seed 7, a one-row shard of the
# embedding gradient at step 3, the reference 16.7 one-roundings, its samples 29-1560 (spread 53), a
# correct subject 304 (4.56x of the first bound).
RMS_SAMPLED_REACH = 4.0
RMS_FLOOR_ULPS = 1.0
ELEMENT_SLACK = 16.0
ELEMENT_FLOOR_ULPS = 4.0
# Reruns of the case-dtype reference with random roundings, for a small tensor that misses its max
# bound or a large one whose RMS misses by at most RMS_SAMPLED_REACH (above).
ROUNDING_SAMPLES = 8
# The RMS error of one rounding of every value, in units of u x rms(oracle): a relative error spread
# over [-u, u] (an upper estimate: round-to-nearest's is u/2 to u depending on the place in the binade).
ONE_ROUNDING_RMS = 3 ** -0.5
# Samples whose RMS errors spread (max / min) beyond this say the tensor's error comes from fewer than
# MIN_RMS_SOURCES independent roundings (see above): an RMS of n Gaussian errors varies by a relative
# 1 / sqrt(2 n) (log-normal sigma), and eight samples span d2 = 2.847 sigmas on average (the
# control-chart constant), so n < 4 spreads them beyond exp(2.847 / sqrt(8)) = 2.74. Of 1250 bf16
# tensors of the sensitivity selection (seed 0) 2.4% spread beyond 2, 0.16% beyond 2.5, none beyond
# 2.93; the RMS misses this admits (vocabulary-269 bias gradients over tp 3/4 in fp32, seeds 1 and 4
# on two CPUs) spread 3.3-7.4.
MIN_RMS_SOURCES = 4
EXPECTED_RANGE_OF_8_NORMALS = 2.847
DISPERSED_SPREAD = float(np.exp(EXPECTED_RANGE_OF_8_NORMALS / np.sqrt(2 * MIN_RMS_SOURCES)))


# RMS_SLACK's premise, that the ratio of a correct run's RMS error to the reference's stays within it,
# holds where many independent roundings make the error. With n sources each, the log of one run's RMS
# error has a standard deviation of about 1 / sqrt(2 n), and the log of the ratio of two runs' of
# sqrt(2) times that: 1 / sqrt(n). RMS_SLACK = 2 is then FEW_SOURCE_Z standard deviations for n >= 19,
# but only 1.7 at n = 6 (a false alarm about once in twenty such checks). The rounding samples measure
# that standard deviation directly (their log RMS errors' spread, pooled over the record's steps where
# they are known), so a tensor that misses its RMS bound gets the slack
# exp(FEW_SOURCE_Z sqrt(2) sigma) where that exceeds RMS_SLACK (see "Few sources" above).
FEW_SOURCE_Z = 3.0


# Monte Carlo arithmetic's samples err wide by about this factor (parity/checks/rounding.py: a move of up
# to a whole unit where round-to-nearest errs by half of one; correct tiny cases measured 0.05-0.2 of the
# sampled bound). A reference whose RMS error lies below every sample's divided by it is a lucky draw,
# not a representative one (see "A reference that rounded luckily" above).
SAMPLES_WIDTH = 2.0
# The most RMS error, in one-roundings (ONE_ROUNDING_RMS u rms(oracle)), that a Monte Carlo sample gives a
# tensor whose values are rounded once: the op's own round-to-nearest (relative error uniform over
# +-s u, s in (1/2, 1] the value's place in its binade) and the sample's move by r u (r uniform over
# [-1, 1]) cast back to the grid, which lands one unit (2 s u) away with probability 1 - s: in
# one-roundings squared, s^2 + 12 (1 - s) s^2, at most 2.26 (s = 0.72), so sqrt 1.50. Samples that all
# exceed it show a computation that errs beyond one rounding of its values, in the samples' own units.
# The lucky-reference gate asked this of the samples over SAMPLES_WIDTH (2 one-roundings raw), a factor
# made for many roundings, not for one: `parity explore --seed 0` (direct_column_gathered bf16,
# vocabulary 23, hidden 2) met an embedding gradient whose samples ran 1.7-3.4 one-roundings, its
# reference 0.45, a correct subject 2.8 (1.06x of the bound), while bf16 weights the reference rounds
# almost exactly (0.05-0.1) have samples of 1.08-1.16 and stay out.
MCA_ONE_ROUNDING = 1.5


@functools.lru_cache(maxsize=None)  # called about 500 times a case with a handful of dtypes
def unit_roundoff(dtype_name) -> float:
    """Half the distance from 1.0 to the next representable value (a name "bf16" or a torch dtype)."""
    dtype = DTYPES[dtype_name] if isinstance(dtype_name, str) else dtype_name
    return float(torch.finfo(dtype).eps) / 2


@dataclass(frozen=True)
class Bound:
    value: float
    reference_error: float
    scale: float

    def describe(self) -> str:
        return (f"{SHARDING_SLACK:g} x ref_err {self.reference_error:.3g} + {FLOOR_ULPS:g} ulp x scale "
                f"{self.scale:.3g}")


def parity_bound(dtype_name, reference_error: float, scale: float) -> Bound:
    value = SHARDING_SLACK * reference_error + FLOOR_ULPS * unit_roundoff(dtype_name) * scale
    return Bound(value, reference_error, scale)


def master_weight_bound(dtype_name: str, reference_error: float, scale: float, movement: float) -> Bound:
    """A low-precision case's float32 master weights (DeepSpeed's bf16/fp16 optimizers, the reference's
    SGD). master = initial - lr * (sum of the step gradients), so it has two precisions: float32 for
    the value it holds (FLOOR_ULPS float32 units of max|oracle|) and the case dtype's for what it has
    moved by, the gradients being computed in bf16/fp16 and rounded differently when sharded
    (FLOOR_ULPS case-dtype units of ``movement`` = max|oracle - initial|), plus SHARDING_SLACK x the
    reference master's own error. A case-dtype floor on the whole value (parity_bound) would hide a
    master rounded to bf16 after every step; a float32 floor alone failed a correct bias shard whose
    reference happened to round its step-0 gradient almost exactly."""
    value = (SHARDING_SLACK * reference_error + FLOOR_ULPS * unit_roundoff("fp32") * scale
             + FLOOR_ULPS * unit_roundoff(dtype_name) * movement)
    return Bound(value, reference_error, scale)


def master_weight_sampled_bound(dtype_name: str, first: Bound, sampled_error: float, movement: float) -> Bound | None:
    """The master bound with the rounding samples' error as the reference error, or None where the
    samples do not disprove the movement floor's premise. That premise: the master's error is a few
    case-dtype units of what it moved by. A master moves by lr x its gradient, and where that gradient
    is a cancelling sum (a 2-row head's input gradient w0 d0 + w1 d1 with d1 ~ -d0, passed on to every
    parameter below the head), a correct sharded run, whose bf16 partial products are rounded before
    the all-reduce, errs relative to the sum's terms, not to the movement; the gradient checks take
    the samples for it already (judge_close). Found by parity explore: column_gathered bf16, vocab 2,
    hidden 2, ZeRO 1/2, clip 0.05: proj/embedding masters at 1.4x while their gradients passed
    (measured at step 0: the subject moved proj.weight[0, 0] by 1.26e-5 where the oracle moved 6.4e-6;
    the reference's single error was 1e-7). Same gate as the gradients': only where the samples' error
    exceeds both the reference's and the movement floor (FLOOR_ULPS case-dtype units of the movement);
    a master kept in bf16 errs by a unit of the weight, hundreds of times the movement, and stays out."""
    if sampled_error <= max(first.reference_error, FLOOR_ULPS * unit_roundoff(dtype_name) * movement):
        return None
    return master_weight_bound(dtype_name, sampled_error, first.scale, movement)


@dataclass(frozen=True)
class Judgement:
    """The worst of the criteria a tensor was held to: the one with the highest measured/bound."""
    passed: bool
    criterion: str  # "max", "rms" or "element"
    measured: float
    bound: float
    index: tuple | None = None  # the element, for the element-wise criterion

    def describe(self) -> str:
        where = f" at {self.index}" if self.index is not None else ""
        return f"{self.criterion} criterion{where}"


def _rms(a: np.ndarray) -> float:
    if not a.size:
        return 0.0
    if a.dtype != np.float64:  # np.mean accumulates float16 in float32: keep its rules for other dtypes
        return float(np.sqrt(np.mean(a * a)))
    # np.add.reduce(...) / size is what np.mean computes for float64, bit for bit, without its per-call
    # dispatch (the comparison calls this about 700 times a case, on tiny arrays).
    return float(np.sqrt(np.add.reduce(a * a, axis=None) / a.size))


def _whole_samples(sampled_error) -> tuple[np.ndarray, float] | None:
    """The rounding samples' errors over the whole tensor a shard was cut from, and that tensor's
    max|oracle|; None where sampled_error offers no whole (it is the whole tensor, or unknown)."""
    whole = getattr(sampled_error, "whole", None)
    return None if whole is None else whole()


def lucky_stand_in(errors: np.ndarray | None, rms_err: float, one_rounding: float,
                   inherits: bool = False) -> float | None:
    """The smallest sample's RMS error over SAMPLES_WIDTH where every sample errs beyond what one rounding
    of the values gives a sample (MCA_ONE_ROUNDING x ``one_rounding``) and the reference's lies below the
    stand-in and below one rounding (a lucky reference, see above), else None. An end-to-end check
    (``inherits``) needs the reference's error only below the stand-in: what it holds beyond one rounding
    is one draw of an inherited few-source error (see "An inherited error's lucky draw" above)."""
    if errors is None or not len(errors):
        return None
    smallest = min(_rms(e) for e in errors)
    if smallest <= MCA_ONE_ROUNDING * one_rounding:
        return None
    stand_in = smallest / SAMPLES_WIDTH
    lucky = rms_err < stand_in and (inherits or rms_err < one_rounding)
    return stand_in if lucky else None


def _samples(sampled_error, oracle: np.ndarray) -> np.ndarray | None:
    """The rounding samples' errors at the places of oracle, one sample per index of the first axis;
    None where the reruns have no such record."""
    errors = sampled_error()
    return errors if errors is not None and len(errors) and errors.shape[1:] == oracle.shape else None


def lse_shared_error(row_max: np.ndarray, lse: np.ndarray, u: float) -> np.ndarray:
    """The bound of each token's log-sum-exp rounding, shared by its whole row (see "A row's shared
    rounding" above): the log of the sum (value lse - max) and the add of the max, each at most u of its value."""
    return u * ((lse - row_max) + np.abs(lse))


def stage_rms_floor_ulps(floor_dtype) -> float:
    """A stage-local check's RMS floor in units of its floor dtype (see above): one rounding of each
    value where the stage accumulates in float32 and rounds to a narrower dtype, RMS_FLOOR_ULPS where
    it computes in its floor dtype."""
    return RMS_FLOOR_ULPS if unit_roundoff(floor_dtype) <= unit_roundoff("fp32") else ONE_ROUNDING_RMS


def rms_bound(rms_err: float, u: float, rms_scale: float, inherits: bool = True,
              floor_ulps: float = RMS_FLOOR_ULPS, slack: float = RMS_SLACK) -> float:
    """The RMS criterion's bound (see above): the part of the reference's RMS error that one rounding of
    the values explains with RMS_SLACK, the part it inherited with SHARDING_SLACK, and the floor. A
    stage-local check (``inherits`` False) inherits nothing: its reference's error is the stage's own
    roundings from exact inputs, many independent ones, all held to RMS_SLACK; its floor is
    ``floor_ulps`` (stage_rms_floor_ulps). ``slack``: a few-source tensor's (few_source_slack) in place
    of RMS_SLACK, and of SHARDING_SLACK where it is larger."""
    if not inherits:
        return slack * rms_err + floor_ulps * u * rms_scale
    one_rounding = ONE_ROUNDING_RMS * u * rms_scale
    return (slack * min(rms_err, one_rounding) + max(SHARDING_SLACK, slack) * max(rms_err - one_rounding, 0.0)
            + RMS_FLOOR_ULPS * u * rms_scale)


def _sample_rms(errors: np.ndarray) -> list[float]:
    """Each sample's RMS error, the entries the oracle leaves nan dropped."""
    finite = np.isfinite(errors).all(axis=0)
    return [_rms(e) for e in (errors if finite.all() else errors[:, finite])]


def _spread(errors: np.ndarray) -> float | None:
    """max / min of the samples' RMS errors (entries the oracle leaves nan dropped): inf where one
    sample is exact and another is not, None where every sample is exact."""
    each = _sample_rms(errors)
    if not each or max(each) == 0:
        return None
    return max(each) / min(each) if min(each) > 0 else float("inf")


def dispersed(errors: np.ndarray | None, trajectory=None) -> bool:
    """The samples' RMS errors further apart than DISPERSED_SPREAD (see above): at this step, or as the
    geometric mean of every step's spread of the same record (``trajectory``: a callable giving the
    samples' errors at each step, this one included)."""
    if errors is None:
        return False
    own = _spread(errors)
    if own is not None and own > DISPERSED_SPREAD:
        return True
    if trajectory is None:
        return False
    spreads = [s for s in map(_spread, trajectory()) if s is not None and np.isfinite(s)]
    return len(spreads) > 1 and float(np.exp(np.mean(np.log(spreads)))) > DISPERSED_SPREAD


def _log_rms_variance(errors: np.ndarray) -> float | None:
    """The variance (ddof 1) of the samples' log RMS errors, entries the oracle leaves nan dropped; None
    where a sample is exact (no log) or there are fewer than two."""
    each = np.array(_sample_rms(errors))
    if len(each) < 2 or not (each > 0).all():
        return None
    return float(np.var(np.log(each), ddof=1))


def few_source_slack(errors: np.ndarray | None, trajectory=None) -> float:
    """The RMS slack a tensor's own rounding samples call for (FEW_SOURCE_Z above): exp(FEW_SOURCE_Z
    sqrt(2) sigma), sigma the standard deviation of the samples' log RMS errors, its variance pooled over
    the record's steps (``trajectory``, as for dispersed) where they are known, never below RMS_SLACK."""
    if errors is None:
        return RMS_SLACK
    pooled = [v for v in map(_log_rms_variance, trajectory() if trajectory is not None else [errors])
              if v is not None]
    if not pooled:
        return RMS_SLACK
    sigma = float(np.sqrt(np.mean(pooled)))
    return max(RMS_SLACK, float(np.exp(FEW_SOURCE_Z * np.sqrt(2.0) * sigma)))


def _element_judgement(diff, ref_err, rms_err: float, u: float, scale, criterion: str) -> Judgement:
    element_bound = ELEMENT_SLACK * (ref_err + rms_err) + ELEMENT_FLOOR_ULPS * u * scale
    if element_bound.min() > 0:  # the usual case: no zero bound, so no 0/0 to guard (errstate costs)
        ratio = diff / element_bound
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(element_bound > 0, diff / element_bound, np.where(diff > 0, np.inf, 0.0))
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    return Judgement(bool(ratio[worst] <= 1), criterion, float(diff[worst]), float(element_bound[worst]),
                     tuple(int(i) for i in worst))


def judge_close(got: np.ndarray, ref: np.ndarray, oracle: np.ndarray, floor_dtype, sampled_error=None,
                inherits: bool = True, shared_rms: float = 0.0, rounded_at: np.ndarray | None = None) -> Judgement:
    """Every criterion above for one tensor; passes when all pass. ``floor_dtype``: a name or torch dtype.
    ``sampled_error``: a callable giving the rounding samples' |rerun - oracle| at the places of
    ``oracle`` (parity/checks/rounding.py), called only for a small tensor that misses its max bound
    or a large one whose RMS misses by at most RMS_SAMPLED_REACH. ``inherits``: False for a stage-local
    check, whose reference starts from exact inputs (rms_bound). ``shared_rms``: the RMS of a stage's
    row-shared roundings, added to the RMS bound (see "A row's shared rounding" above). ``rounded_at``: per
    entry of oracle, the magnitude of an intermediate a valid evaluation rounds, where it may exceed
    |oracle| (see "A biased head's product" above): the floors' scale is the larger of the two."""
    if not got.size:
        return Judgement(True, "max", 0.0, 0.0)
    u = unit_roundoff(floor_dtype)
    diff, ref_err = np.abs(got - oracle), np.abs(ref - oracle)
    scale = np.abs(oracle) if rounded_at is None else np.maximum(np.abs(oracle), np.abs(rounded_at))
    max_diff, max_ref_err, max_scale = float(diff.max()), float(ref_err.max()), float(scale.max())
    bound = parity_bound(floor_dtype, max_ref_err, max_scale).value
    results = [Judgement(max_diff <= bound, "max", max_diff, bound)]
    if not results[0].passed and got.size < ELEMENTWISE_MIN_SIZE and sampled_error is not None:
        errors = _samples(sampled_error, oracle)
        sampled = 0.0 if errors is None else float(errors.max())
        # Only where the samples disprove the floor's premise (rounding errors within FLOOR_ULPS units
        # of max|oracle|): a cancelling sum, whose terms are larger than any of its results. A shard is
        # gated by its whole tensor (see above).
        cancels = sampled > max(max_ref_err, FLOOR_ULPS * u * max_scale)
        whole = _whole_samples(sampled_error) if errors is not None and not cancels else None
        if whole is not None and len(whole[0]):
            cancels = (sampled > max_ref_err
                       and float(whole[0].max()) > max(max_ref_err, FLOOR_ULPS * u * max(max_scale, whole[1])))
        if cancels:
            bound = parity_bound(floor_dtype, sampled, max_scale).value
            results = [Judgement(max_diff <= bound, "sampled max", max_diff, bound)]
    if got.size >= ELEMENTWISE_MIN_SIZE:
        rms_err, rms_scale = _rms(ref_err), _rms(scale)
        cancelling = None  # the samples' errors where they disprove the premise of both criteria below
        taken = []  # the rounding samples at the places of oracle, taken once, on the first miss that needs them

        def samples():
            if not taken:
                taken.append(_samples(sampled_error, oracle))
            return taken[0]

        def samples_disprove():
            """The samples' elementwise errors (their max over the samples) where their RMS exceeds the
            reference's and FLOOR_ULPS units of the values' RMS (the entries inherit a few cancelling sums'
            errors: see above), else None."""
            nonlocal cancelling
            if cancelling is None:
                errors = samples()
                cancelling = False
                if errors is not None:
                    largest = errors.max(axis=0)
                    if _rms(largest) > max(rms_err, FLOOR_ULPS * u * rms_scale):
                        cancelling = largest
            return None if cancelling is False else cancelling

        steps = getattr(sampled_error, "steps", None)
        trajectory = None if steps is None else functools.cache(steps)  # the RMS and element criteria share it

        @functools.cache
        def samples_dispersed() -> bool:  # asked by the max, RMS and element criteria alike
            return dispersed(samples(), trajectory)

        if not results[0].passed and sampled_error is not None and samples_dispersed():
            # The max bound's premise, that the largest of many elements' errors is a stable estimate,
            # fails where the samples say the entries share a few sources (see "The max criterion of a
            # few-source tensor" above): the samples' largest error stands for the reference's.
            sampled = float(samples().max())
            if sampled > max_ref_err:
                bound = parity_bound(floor_dtype, sampled, max_scale).value
                results = [Judgement(max_diff <= bound, "sampled max", max_diff, bound)]
        floor_ulps = RMS_FLOOR_ULPS if inherits else stage_rms_floor_ulps(floor_dtype)
        one_rounding = ONE_ROUNDING_RMS * u * rms_scale
        bound_rms = rms_bound(rms_err, u, rms_scale, inherits, floor_ulps) + shared_rms
        rms_diff = _rms(diff)
        rms_judged = Judgement(rms_diff <= bound_rms, "rms", rms_diff, bound_rms)
        if (not rms_judged.passed and sampled_error is not None
                and (rms_judged.measured <= RMS_SAMPLED_REACH * bound_rms or samples_dispersed())):
            # Only where the samples disprove the RMS's premise (see above): by magnitude, a few
            # cancelling sums' errors inherited by every entry; by dispersion, too few independent
            # roundings for one run's RMS error to stand for another's.
            errors = samples_disprove()
            if errors is not None:
                bound_rms = max(bound_rms, RMS_SLACK * _rms(errors) + floor_ulps * u * rms_scale + shared_rms)
                rms_judged = Judgement(rms_diff <= bound_rms, "sampled rms", rms_diff, bound_rms)
            elif samples_dispersed():
                bound_rms = max(bound_rms, RMS_SLACK * max(_rms(e) for e in samples()) + floor_ulps * u * rms_scale
                                + shared_rms)
                rms_judged = Judgement(rms_diff <= bound_rms, "dispersed rms", rms_diff, bound_rms)
            elif (stand_in := lucky_stand_in(samples(), rms_err, one_rounding, inherits)) is not None:
                bound_rms = max(bound_rms, rms_bound(stand_in, u, rms_scale, inherits, floor_ulps) + shared_rms)
                rms_judged = Judgement(rms_diff <= bound_rms, "lucky-reference rms", rms_diff, bound_rms)
            elif not inherits and (slack := few_source_slack(samples(), trajectory)) > RMS_SLACK:
                # Few sources, yet more than the dispersion test's: one run's RMS error stands for
                # another's only within the samples' own spread (FEW_SOURCE_Z). A stage-local check
                # only: there the subject's roundings and the reference's are independent draws.
                bound_rms = max(bound_rms, rms_bound(rms_err, u, rms_scale, inherits, floor_ulps, slack) + shared_rms)
                rms_judged = Judgement(rms_diff <= bound_rms, "few-source rms", rms_diff, bound_rms)
        results.append(rms_judged)
        element = _element_judgement(diff, ref_err, rms_err, u, scale, "element")
        used = (ref_err, rms_err, "element")  # the reference errors the element criterion was held to
        if not element.passed and sampled_error is not None:
            # The same premise, element by element: an entry's own reference error and its
            # neighbourhood's are one rounding's where every entry inherits cancelling sums' errors
            # (parity explore --seed 8: hf_plan_tied vocab 2, q/k_proj weight gradients at 1.37x).
            errors = samples_disprove()
            if errors is None and samples_dispersed():
                # The neighbourhood, rms(ref - oracle), is one run's RMS error: dispersed samples say
                # it does not stand for another's (the RMS's second premise, above).
                errors = samples().max(axis=0)
            if errors is not None:
                used = (np.maximum(ref_err, errors), max(rms_err, _rms(errors)), "sampled element")
                element = _element_judgement(diff, *used[:2], u, scale, used[2])
            elif (stand_in := lucky_stand_in(samples(), rms_err, one_rounding, inherits)) is not None:
                # A lucky reference's RMS error understates the neighbourhood too (see above).
                used = (ref_err, stand_in, "lucky-reference element")
                element = _element_judgement(diff, *used[:2], u, scale, used[2])
        if not element.passed and diff.ndim >= 2 and diff.shape[-1] > 1:
            # The neighbourhood is the element's row where that row's computation errs more than the
            # tensor's typical one (see "A row's neighbourhood" above).
            rows = np.sqrt(np.mean(ref_err * ref_err, axis=-1, keepdims=True))
            if (rows > used[1]).any():
                element = _element_judgement(diff, used[0], np.maximum(used[1], rows), u, scale, "row " + used[2])
        results.append(element)

    def ratio_of(j):
        return 0.0 if j.measured == 0 else (np.inf if j.bound == 0 else j.measured / j.bound)

    worst = max(results, key=ratio_of)
    return Judgement(all(j.passed for j in results), worst.criterion, worst.measured, worst.bound, worst.index)


# A clipped update is w - lr * (g * c), with c = clip / (norm + 1e-6) computed by the subject in
# float32. Beside the weight's own roundings (above), each of these is relative to the update, not
# to the weight, and dominates where the weight is small beside its update (parity explore
# --seed 1: a 2-row tied embedding whose padding row starts at zero, 3.4 units of the update):
# the eps add and the divide making c, g * c, the cast of lr to float32 and lr * (g * c): one
# float32 rounding each.
CLIP_UPDATE_UNITS = 5


def sgd_identity_bound(dtype_name: str, weight_scale: float, clipped: bool = False, update_scale: float = 0.0,
                       coefficient_error: float = 0.0) -> float:
    """How far w' may be from w - lr g (g already multiplied by the check's clipping coefficient).
    update_scale: max |lr g|; coefficient_error: the relative error of the check's coefficient
    against the subject's own (clip_coefficient_error). Both matter only when clipped."""
    if dtype_name == "fp32" and not clipped:
        return 0.0
    # bf16/fp16: the master weight is within half a unit of the model weight, plus the cast back:
    # one unit in all. Clipping scales the gradient by a rounded coefficient first: one more unit.
    # weight_scale: the larger magnitude of the weights before and after the update (the master's
    # half unit is relative to the weight before, the cast's to the weight after).
    units = (2 if dtype_name != "fp32" else 0) + (2 if clipped else 0)
    bound = units * unit_roundoff(dtype_name) * weight_scale
    if clipped:
        bound += (CLIP_UPDATE_UNITS * unit_roundoff("fp32") + coefficient_error) * update_scale
    return bound


def clip_coefficient_error(reports_norm: bool, entries: int) -> float:
    """Relative error of the clipping coefficient the check uses against the one the subject used.

    With the subject's own reported norm the check's coefficient is the subject's up to the roundings
    CLIP_UPDATE_UNITS counts: 0. Otherwise the check computes the norm in float64 from the subject's
    own recorded gradients (Comparison.observed_grad_norm), and the subject's float32 sum of squares
    of ``entries`` values and its square root are within e = gamma(n, u) + one unit of it, relative;
    the coefficient clip / n (min(1, clip / n) moves less) within e / (1 - e)."""
    if reports_norm:
        return 0.0
    u32 = unit_roundoff("fp32")
    e = gamma(max(entries, 1), u32) + u32
    return e / (1 - e)


# -- Reading the ratios (reports and run comparison; nothing here decides a verdict) ------------
# A case is "near-failing" when its worst measured/bound ratio reaches this fraction of the bound:
# report.html plots it next to the failures. Passing cases of the default matrix reach 0.21 in fp32
# and 0.77 in bf16/fp16 (README "Tolerances"), so half the bound singles out the low-precision
# cases closest to it and an fp32 case whose error has doubled.
NEAR_FAILING_RATIO = 0.5
# `parity diff` lists a case whose worst ratio moved by at least this much, absolute, in units of
# its bound. Absolute, not a factor: ratios are already normalised by the bound, and a factor
# would flag 1e-4 -> 1e-3 (irrelevant) as loudly as 0.3 -> 0.9 (nearly failing).
RATIO_CHANGE = 0.1


# -- Stage-local bounds (the scale cases, parity/scale/) ----------------------------------------
# At production shapes there is no whole float64 trajectory; each stage is re-evaluated in float64
# on the subject's own inputs to that stage (references/stage_oracles.py), so the bound is the
# rounding error that stage's own arithmetic may make, elementwise, from rounding-error analysis,
# not a multiple of a measured error:
#
# - a sum of n terms accumulated in precision u: |err| <= g(n, u) * sum|terms|. The worst-case
#   g = gamma(n, u) = n u / (1 - n u) (Higham, Accuracy and Stability, ch. 3) is 1.5% at n = 256000
#   in fp32: a bound that loose would pass a 1% wrong loss, so the bound is the probabilistic one of
#   Higham & Mary (SIAM J. Sci. Comput. 41(5), 2019, Thm 2.4): rounding errors independent and of
#   mean zero, |err| <= (exp(lam sqrt(n) u + n u^2 / (1 - u)) - 1) sum|terms| with probability at
#   least 1 - 2 n exp(-lam^2 (1 - u)^2 / 2). LAMBDA = 10: about 1e-16 per sum at n = 256000, so
#   under 1e-5 for all the 1e10 elements of a run together.
# - a GEMM: cuBLAS accumulates bf16 and fp32 GEMMs in fp32 (bf16 x bf16 products are exact in fp32),
#   then one rounding to the output type (+ u_out |result|). With torch's default
#   allow_bf16_reduced_precision_reduction (True) a bf16 GEMM may round split-K partial sums to
#   bf16 before adding them; their magnitudes are bounded only by sum|a_k b_k|, so bf16 GEMMs get
#   SPLIT_K_ROUNDINGS units of u_bf16 on sum|a_k b_k| (worst case: no probabilistic cancellation
#   can be assumed for an unknown split). This dominates the bf16 logits/gradient bounds.
# - a softmax/CE row in fp32 (both DeepSpeed backends upcast; Liger's kernel works in fp32; the
#   suite's CE upcasts as HF's does): exp(z - m) has relative error <= (|z - m| + 1) u, the sum of
#   V positive terms g(V, u) relative, the log, the divide and the final subtraction one unit each
#   on their operands: per token |loss err| <= g(V, u) + CE_UNITS u (|m| + |lse| + |z_t| + |loss|),
#   and p_ij has relative error <= g(V, u) + CE_UNITS u (1 + |z_ij| + |m| + |lse|). A mean over N
#   tokens adds g(N, u) sum|loss_i| / N. The gradient (p - onehot) * (1/N) adds, on |g|, GRAD_OUT_UNITS
#   fp32 units (the onehot subtraction, the upstream 1/N's own rounding, the multiply by it) and one
#   unit of the gradient's dtype for the cast back where that is not fp32 (a first CPU rehearsal
#   with two units instead of three measured 1.04 in fp32).
# - an SGD step w - lr g in the parameter's dtype: one rounding of the result, u_w |w'|, and one of
#   the product lr g, which torch's CUDA kernels keep in fp32 but its CPU bf16 kernel rounds to bf16
#   (measured 1.23 of a bound that assumed fp32 there): 2 u_w lr |g|.
#   Round-to-nearest reaches u |w'| where w' sits just above a power of two: ratios near 1 here are
#   the bound being attained, not approached.
SPLIT_K_ROUNDINGS = 2.0
CE_UNITS = 6.0  # subtract, exp, divide, log, add, subtract: one rounding each
GRAD_OUT_UNITS = 3.0
LAMBDA = 10.0


def gamma(n: int, u: float) -> float:
    """Sum bound g(n, u): the smaller of the worst case n u / (1 - n u), which always holds (and is
    the smaller for a handful of terms, as in a TP=2 sum), and the probabilistic one (LAMBDA above)."""
    import math

    worst = n * u / (1 - n * u) if n * u < 1 else math.inf
    return min(worst, math.expm1(LAMBDA * math.sqrt(n) * u + n * u * u / (1 - u)))


def matmul_error_coeff(n: int, out_dtype: str) -> tuple[float, float]:
    """(coefficient of sum|a_k b_k|, coefficient of |result|) for a length-n product rounded to out_dtype."""
    u32, u_out = unit_roundoff("fp32"), unit_roundoff(out_dtype)
    split_k = SPLIT_K_ROUNDINGS * u_out if out_dtype != "fp32" else 0.0
    return gamma(n, u32) + split_k, u_out


def ce_sum_coeff(vocab: int) -> float:
    """Relative error of the fp32 sum of exponentials over `vocab` columns (an absolute error of its log)."""
    return gamma(vocab, unit_roundoff("fp32"))


def ce_unit_coeff() -> float:
    """Coefficient of the operand magnitudes for the fp32 CE's elementwise roundings."""
    return CE_UNITS * unit_roundoff("fp32")


def ce_grad_out_coeff(grad_dtype: str) -> float:
    """Coefficient of |dlogits| for the roundings after the softmax (see above)."""
    cast = unit_roundoff(grad_dtype) if grad_dtype != "fp32" else 0.0
    return GRAD_OUT_UNITS * unit_roundoff("fp32") + cast


def sgd_error_coeff(weight_dtype: str) -> tuple[float, float]:
    """(coefficient of |w'|, coefficient of lr |g|) for one SGD step in the weight's dtype."""
    u_w = unit_roundoff(weight_dtype)
    return u_w, 2 * u_w

# `parity sensitivity` (parity/sensitivity.py): the systematic relative error (x -> (1 + eps) x on
# one rank) every check kind must catch, per case dtype (issue 15). A few unit roundoffs of the
# dtype: fp32 u = 6e-8, bf16 u = 3.9e-3, fp16 u = 4.9e-4.
SENSITIVITY_TARGETS = {"fp32": 1e-5, "bf16": 1e-2, "fp16": 2e-3}
