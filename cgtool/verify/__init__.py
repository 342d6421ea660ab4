"""A plan checked on the GPU: sampled steps replayed through the plan's and the default's
graphs, measured against the plan's predictions, and its memory fraction rehearsed.

`steps` (sampling) and `population` (the plan's steps and cost model) run on the CPU;
`session` needs CUDA; `result` is verify.json; `profile` feeds it back to `cgtool plan`.
"""
