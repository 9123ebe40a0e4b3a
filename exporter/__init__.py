"""The gpulens node exporter (installed as `gpulens.exporter`).

It must stay small: no pandas, numpy-heavy code or scikit-learn imports anywhere below here.
"""
