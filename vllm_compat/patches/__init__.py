"""Patches, one module per upstream drift point; ``catalogue`` lists them as data."""
