"""The fields prometheus-adapter's rule templates may name, in a module without pydantic.

Why apart from `metric_rules`: the adapter's template compiler needs them while serving, and the serving
process does not import the config models (gpuwarden/config/view.py).
"""

QUERY_TEMPLATE_FIELDS = ("Series", "LabelMatchers", "LabelValuesByName", "GroupBy", "GroupBySlice")
RESOURCE_TEMPLATE_FIELDS = ("Group", "Resource")
