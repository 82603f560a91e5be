"""Detection: generic facts about the installed (or given) vLLM and vllm-omni, never a drift point's own.

``source_tree`` reads files of installed packages, unpacked trees and wheels; ``static`` holds the sites drift
points read their static facts from; ``runtime`` the helpers they use to ask the imported modules the same;
``model`` the records both share (a function's parameters); ``import_drift`` and its helpers check vllm-omni's
imports against vLLM; ``versions`` and ``wheels`` read and fetch distributions.
"""
