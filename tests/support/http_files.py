"""A local HTTP server (127.0.0.1, port 0, a daemon thread) for the download tests: the first segment of the
request path chooses how it serves its one payload, whatever the rest of the path is.

  whole      the payload; a Range request gets the rest (206), or 416 with ``bytes */N`` past its end
  truncated  announces the whole payload (Content-Length) but sends half of it and closes the connection
  html       an HTML error page with status 200
  endless    no Content-Length, bytes until the client goes (at most ENDLESS_CAP, so no test can hang)
  norange    416 to every Range request; the whole payload otherwise
  held       as ``whole``, but the first request sends half the payload, then waits for ``release`` (at most
             HOLD_S) before the rest: a download that is still running
Every request is recorded in ``requests`` as (mode, Range header or None).
"""
import http.server
import threading

ENDLESS_CAP = 64 << 20
HOLD_S = 120
HTML_PAGE = b"<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head><body>Bad Gateway</body></html>\n"


class FileServer:
    """Serves `payload` in the modes above; use as a context manager, `url(mode, path)` gives a URL."""

    def __init__(self, payload):
        self.payload, self.requests = payload, []
        self.release, self.first_held = threading.Event(), threading.Event()
        self.lock = threading.Lock()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def base(self, mode):
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{mode}/"

    def url(self, mode, path="w.bin"):
        return self.base(mode) + path


def _handler(server):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            mode = self.path.strip("/").split("/")[0]
            rng = self.headers.get("Range")
            with server.lock:
                server.requests.append((mode, rng))
                first = sum(1 for m, _ in server.requests if m == mode) == 1
            try:
                getattr(self, "_" + mode)(rng, first)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away: what an endless or held body ends with

        def _whole(self, rng, first, hold=False):
            data = server.payload
            if rng:
                start = int(rng.split("=")[1].split("-")[0])
                if start >= len(data):
                    return self._refuse_range()
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                data = data[start:]
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if hold:
                self.wfile.write(data[:len(data) // 2])
                self.wfile.flush()
                server.first_held.set()
                server.release.wait(HOLD_S)
                data = data[len(data) // 2:]
            self.wfile.write(data)

        def _held(self, rng, first):
            self._whole(rng, first, hold=first)

        def _truncated(self, rng, first):
            self.send_response(200)
            self.send_header("Content-Length", str(len(server.payload)))
            self.end_headers()
            self.wfile.write(server.payload[:len(server.payload) // 2])
            self.close_connection = True

        def _html(self, rng, first):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(HTML_PAGE)))
            self.end_headers()
            self.wfile.write(HTML_PAGE)

        def _endless(self, rng, first):
            self.send_response(200)
            self.end_headers()
            block = b"\0" * (1 << 16)
            for _ in range(ENDLESS_CAP // len(block)):
                self.wfile.write(block)
            self.close_connection = True

        def _norange(self, rng, first):
            if rng:
                return self._refuse_range()
            self._whole(None, first)

        def _refuse_range(self):
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(server.payload)}")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    return Handler
