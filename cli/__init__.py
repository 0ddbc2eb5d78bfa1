"""The accum-train command line (click). Only this package imports click and progressbar2."""
