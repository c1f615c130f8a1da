# sandboxd's Python context: one interpreter whose namespace persists between
# runs. Protocol (see interp.go): the first stdin line is a nonce; then each
# stdin line is a JSON request {"code", "seq", "maxResult", "maxDisplay"}.
# After each run the interpreter writes MARK + JSON result + "\n" on stdout and
# MARK + seq + "\n" on stderr, where MARK = "\x1e" + nonce + "\x1f";
# everything else on the two streams is the run's output (child processes'
# included).
import ast, base64, json, os, signal, sys, traceback

def write_all(fd, b):
    while b:
        b = b[os.write(fd, b):]

def _main():
    proto = os.fdopen(os.dup(0), "rb")
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)  # input() must not read the protocol
    os.close(null)
    sys.stdin = open(0, closefd=False)
    mark = b"\x1e" + proto.readline().strip() + b"\x1f"
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    displays = []

    def bundle(obj):
        out = []
        for meth, mime, binary in (("_repr_png_", "image/png", True), ("_repr_jpeg_", "image/jpeg", True),
                                   ("_repr_svg_", "image/svg+xml", False), ("_repr_html_", "text/html", False),
                                   ("_repr_markdown_", "text/markdown", False), ("_repr_json_", "application/json", False)):
            f = getattr(obj, meth, None)
            if f is None or isinstance(obj, type):
                continue
            try:
                v = f()
            except Exception:
                continue
            if v is None:
                continue
            if binary:
                if isinstance(v, str):
                    v = v.encode("latin-1")
                v = base64.b64encode(v).decode()
            elif not isinstance(v, str):
                v = json.dumps(v, default=str)
            out.append({"mime": mime, "data": v})
        return out

    def display(*objs):
        """Show rich output: objects with _repr_png_/_repr_svg_/_repr_html_... (text otherwise)."""
        for o in objs:
            b = bundle(o)
            displays.extend(b or [{"mime": "text/plain", "data": repr(o)}])

    ns["display"] = display

    def figures():
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        import io
        for num in plt.get_fignums():
            buf = io.BytesIO()
            plt.figure(num).savefig(buf, format="png")
            displays.append({"mime": "image/png", "data": base64.b64encode(buf.getvalue()).decode()})
        plt.close("all")

    def run(code):
        tree = ast.parse(code, "<cell>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<cell>", "exec"), ns)
        if last is not None:
            return eval(compile(last, "<cell>", "eval"), ns)
        return None

    running = [False]

    def on_sigint(signum, frame):
        # An interrupt that arrives between runs (a late timeout) is ignored.
        if running[0]:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)

    pid = os.getpid()
    while True:
        line = proto.readline()
        if not line:
            return
        req = json.loads(line)
        del displays[:]
        res = {"seq": req["seq"], "result": None, "error": None, "truncated": False}
        try:
            running[0] = True
            try:
                v = run(req["code"])
            finally:
                running[0] = False
            if v is not None:
                ns["_"] = v
                r = repr(v)
                if len(r) > req["maxResult"]:
                    r, res["truncated"] = r[:req["maxResult"]], True
                res["result"] = r
                displays.extend(bundle(v))
        except BaseException as e:  # SystemExit and KeyboardInterrupt too: the context lives on
            tb = traceback.extract_tb(e.__traceback__)
            tb = [f for f in tb if f.filename != _main.__code__.co_filename]
            res["error"] = {"name": type(e).__name__, "value": str(e),
                            "traceback": "".join(["Traceback (most recent call last):\n"] + traceback.format_list(tb) + traceback.format_exception_only(type(e), e))}
        try:
            figures()
        except Exception:
            pass
        if os.getpid() != pid:
            os._exit(0)  # a child forked by the cell must not answer
        res["display"], size = [], 0
        for d in displays:
            size += len(d["data"]) + len(d["mime"])
            if size > req["maxDisplay"]:
                res["truncated"] = True
                break
            res["display"].append(d)
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass
        frame = json.dumps(res, default=str, ensure_ascii=False).encode("utf-8", "backslashreplace")
        write_all(1, mark + frame + b"\n")
        write_all(2, mark + str(req["seq"]).encode() + b"\n")

_main()
