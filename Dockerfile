# One image for every robotloop service; docker-compose.yml picks the command.
FROM python:3.12-slim
RUN apt-get update && apt-get install -y --no-install-recommends \
        libavcodec59 libavformat59 libavutil57 libswscale6 libswresample4 libavdevice59 libavfilter8 libegl1 libgl1 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY robotloop ./robotloop
COPY services ./services
RUN pip install --no-cache-dir ".[full]"
ENV MUJOCO_GL=egl
ENTRYPOINT ["robotloop"]
