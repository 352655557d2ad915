"""The analysis side: a run's records and the report's numbers (``rows``), Markdown tables (``tables``),
figures (``plots``), the report builder (``builder``), k-curves from one pool (``kcurves``), bootstrap
statistics (``stats``), the coupled SRD vs rejection-sampling comparison (``coupled``) and loading runs
from the store (``loading``). Imports only downward: the results side, the store, method constants.
"""
