"""The prediction service (`agt serve`): private predictions over HTTP, through the ledger.

Application layer, like `agt.cli`: it sits on top of the library (`agt`, `mechanisms`) and
nothing but the command line imports it. `server.PredictionService` answers requests through
`mechanisms.Ledger.answer_batch` (the same door as every release), `app.create_app` wraps it
in a FastAPI application with API keys (`keys.KeyStore`), and `agt.client.Client` talks to
it. FastAPI, uvicorn and httpx come with the ``serve`` extra.
"""
