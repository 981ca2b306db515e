package control

import (
	"github.com/vipd/vipd/agent"
	"github.com/vipd/vipd/monitor/status"
)

// Reply is the control API's answer, as JSON.
type Reply struct {
	Applied []string         `json:"applied,omitempty"`
	Failed  []string         `json:"failed,omitempty"`
	Planned []string         `json:"planned,omitempty"`
	Status  *status.Snapshot `json:"status,omitempty"`
	Error   string           `json:"error,omitempty"`
}

// ReplyOf is the reply that tells what a command did.
func ReplyOf(out agent.Outcome, err error) Reply {
	var rep Reply
	for _, op := range out.Applied {
		rep.Applied = append(rep.Applied, op.String())
	}
	for _, f := range out.Failed {
		rep.Failed = append(rep.Failed, f.Error())
	}
	if err != nil {
		rep.Error = err.Error()
	}
	return rep
}
