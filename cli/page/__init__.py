"""`schedspec explore`: the interactive page (static/) and the API that runs the spec for it (app.py, core.py)."""
