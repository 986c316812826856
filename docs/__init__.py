"""Teaching documentation for DASH: Markdown pages plus the code that draws their figures.

``python -m docs.figures`` regenerates every figure under
``docs/figures/``, the numbers the prose quotes (``docs/figures/numbers.json``), the command
transcripts, and refreshes the generated numbers inside the Markdown pages.
"""
