"""Generated PTX, one folder per arch with a manifest.json. Regenerate with `ptxgen emit`; never edit by hand."""
