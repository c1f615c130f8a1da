package portal

import (
	"fmt"
	"html/template"
	"net/http"
	"time"
)

var pageTmpl = template.Must(template.New("page").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
{{if .Refresh}}<meta http-equiv="refresh" content="1">{{end}}
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}</title>
<style>
body{font:15px/1.5 system-ui,sans-serif;background:#0f1419;color:#e6e6e6;display:flex;min-height:100vh;margin:0;align-items:center;justify-content:center}
main{max-width:34em;padding:2em}
h1{font-size:1.3em;font-weight:600;margin:0 0 .5em}
.bar{height:4px;background:#243040;border-radius:2px;overflow:hidden;margin:1em 0}
.bar i{display:block;height:100%;width:{{.Percent}}%;background:#4c9aff}
small{color:#8a96a3}
a{color:#4c9aff}
</style></head>
<body><main><h1>{{.Title}}</h1>{{if .Refresh}}<div class="bar"><i></i></div>{{end}}
<p>{{.Message}}</p>{{if .Links}}<ul>{{range .Links}}<li><a href="{{.Href}}">{{.Text}}</a></li>{{end}}</ul>{{end}}{{if .Detail}}<p><small>{{.Detail}}</small></p>{{end}}</main></body></html>
`))

// Page is a plain page the portal shows a person (starting, stopped,
// signed out). Its text is fixed or escaped; it runs no script.
type Page struct {
	Title, Message, Detail string
	Refresh                bool
	Percent                int
	Links                  []Link
}

// Link is a link on a page (a path on the same origin).
type Link struct{ Href, Text string }

// WritePage answers a page with status. The page may not be framed by
// another origin and loads nothing.
func WritePage(w http.ResponseWriter, status int, pg Page) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'self'")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	pageTmpl.Execute(w, pg)
}

var enterTmpl = template.Must(template.New("enter").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="0;url={{.}}">
<title>Opening the sandbox…</title></head>
<body><p><a href="{{.}}">Continue to the sandbox</a></p></body></html>
`))

// EnterPage sends the browser on to next (a path on this origin) from a
// page of this origin, so that its request is same-origin: a redirect
// would carry the site of whoever started the chain (the API's origin).
func EnterPage(w http.ResponseWriter, next string) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'")
	h.Set("Referrer-Policy", "no-referrer")
	w.WriteHeader(http.StatusOK)
	enterTmpl.Execute(w, next)
}

// startingPage tells a person the service is starting; it reloads itself
// every second until the service answers.
func (p *Portal) startingPage(w http.ResponseWriter, run *running) {
	elapsed := p.now().Sub(run.started).Round(time.Second)
	_, restarts, last := run.status()
	pg := Page{
		Title:   "Starting " + run.svc.Title + "…",
		Message: fmt.Sprintf("%s is starting in this sandbox (%s so far). This page reloads by itself.", run.svc.Title, elapsed),
		Refresh: true,
		// A rough guide: most services answer within half a minute.
		Percent: min(95, int(elapsed/time.Second)*100/30),
	}
	if restarts > 0 {
		pg.Detail = fmt.Sprintf("It %s and was restarted %d time(s); the session's log has its output.", last, restarts)
	}
	w.Header().Set("Retry-After", "1")
	WritePage(w, http.StatusServiceUnavailable, pg)
}
