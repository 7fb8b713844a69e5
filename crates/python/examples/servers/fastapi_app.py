"""The model as a FastAPI service, for `uvicorn --workers 2`:

    uvicorn --app-dir crates/python/examples/servers fastapi_app:app --workers 2

POST /infer {"seed": 1, "batch": 4} -> {"sha256": ..., "pid": ...};
GET /memory -> the answering worker's RSS, peak and arena."""

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

import model

app = FastAPI()


class Request(BaseModel):
    seed: int
    batch: int = 1


@app.post("/infer")
async def infer(req: Request) -> dict:
    # The run releases the GIL: a thread of the pool runs it, the event
    # loop goes on.
    return await run_in_threadpool(model.infer, req.seed, req.batch)


@app.get("/memory")
def memory() -> dict:
    return model.memory()
