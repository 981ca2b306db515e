package main

import (
	"net/http"
	"sync/atomic"

	"github.com/vipd/vipd/agent"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/monitor/status"
	"github.com/vipd/vipd/monitor/statuspage"
)

// pageHistory has the agent feed every status snapshot it takes to the
// status page's history, once the page is served (statusPage).
func pageHistory(aopts *agent.Options) *atomic.Pointer[statuspage.History] {
	var h atomic.Pointer[statuspage.History]
	aopts.OnStatus = func(snap *status.Snapshot) {
		if hist := h.Load(); hist != nil {
			hist.Observe(snap)
		}
	}
	return &h
}

// statusPage returns the status page's routes for the metrics listener,
// none when [daemon] status_page is off or nothing is served.
func statusPage(a *agent.Agent, d config.Daemon, history *atomic.Pointer[statuspage.History]) map[string]http.Handler {
	if !d.StatusPage || d.MetricsListen == "" {
		return nil
	}
	h := statuspage.NewHistory()
	history.Store(h)
	return statuspage.New(statuspage.Options{Status: a.Status, Last: a.LastStatus, History: h, Version: versionString()}).Routes()
}
