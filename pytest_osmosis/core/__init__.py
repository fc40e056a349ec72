"""The vocabulary every part of the plugin shares, with no dependency on pytest.

``errors`` (the error types a user meets), ``outcome`` (a row's verdict and what it means
for the session), ``words`` (how counts, rates and costs are written) and ``copying``
(deep copies of rollout values). Every other subpackage may import these; they import
nothing of the plugin but each other.
"""
