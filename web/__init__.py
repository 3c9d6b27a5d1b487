"""The browser side: the page and runner module (npm onnxruntime-web), the aiohttp server and the Playwright driver."""
