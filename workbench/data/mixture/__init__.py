"""Weighted mixtures (``[[data.mixture]]``): several corpora trained on in stated shares.

- ``mixture_plan``     a weighted mixture's plan: counts by apportionment, an order exact at every prefix, a
                       sampler whose state is a counter (pure: no corpus read)
- ``mixture_data``     a prepared mixture: each source a corpus prepared as today, drawn in the plan's order
"""
