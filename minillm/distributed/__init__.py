"""Chapter 10: one model across several processes (tensor parallelism, Megatron-style).

``tensor_parallel`` cuts the weights (which slice of each matrix a rank keeps, and the one
all-reduce after each pair of matmuls); ``workers`` runs the other ranks as processes that the
driver's runner sends each step to.
"""
