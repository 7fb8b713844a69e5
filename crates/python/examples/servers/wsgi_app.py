"""The model as a WSGI app, for `gunicorn --preload` (sessions made once in
the master, workers forked from it):

    gunicorn --chdir crates/python/examples/servers --preload --workers 2 wsgi_app:app

POST /infer {"seed": 1, "batch": 4}; GET /memory, as fastapi_app.py."""

import json

import model


def app(environ, start_response):
    path = environ.get("PATH_INFO", "")
    try:
        if path == "/infer" and environ["REQUEST_METHOD"] == "POST":
            size = int(environ.get("CONTENT_LENGTH") or 0)
            req = json.loads(environ["wsgi.input"].read(size) or b"{}")
            body, status = model.infer(int(req["seed"]), int(req.get("batch", 1))), "200 OK"
        elif path == "/memory":
            body, status = model.memory(), "200 OK"
        else:
            body, status = {"error": "not found"}, "404 Not Found"
    except (KeyError, ValueError) as e:
        body, status = {"error": str(e)}, "400 Bad Request"
    data = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]
