"""PromQL scoping shared by everything that writes PromQL for a deployment (installed as `gpulens.promscope`).

`config` holds the one configuration (selector, remediateSelector, clusterLabel,
runbookURLPattern: kube-prometheus' mixin `_config`) and `scope(config)`; `promql` applies a scope
to an expression, keeping its layout. The mixin's rules, the analyzer's recording rules and the
dashboards all import it from here, below them, so none of them imports another to get it.
"""
