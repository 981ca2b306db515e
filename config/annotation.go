package config

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/health"
)

// MaxCheckText bounds the text ParseCheck takes.
const MaxCheckText = 4096

// ParseCheck parses a health check written as a TOML inline table with
// the keys of [service.check], as the Kubernetes source's vipd.io/check
// annotation holds it ({ type = "http", path = "/healthz" }), with the
// file's messages. It returns nil for type = "none". Exec checks are
// refused: whoever may annotate a Service must not run commands on the
// load balancer.
func ParseCheck(text string) (*health.Spec, error) {
	if len(text) > MaxCheckText {
		return nil, fmt.Errorf("longer than %d bytes", MaxCheckText)
	}
	data := []byte("check = " + text + "\n")
	if err := checkLimits("annotation", data); err != nil {
		return nil, err
	}
	var doc struct {
		Check *rawCheck `toml:"check"`
	}
	md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&doc)
	if err != nil {
		return nil, fmt.Errorf("not a TOML inline table of check keys: %v", strings.TrimPrefix(err.Error(), "toml: "))
	}
	if u := md.Undecoded(); len(u) > 0 {
		return nil, fmt.Errorf("unknown key %s", strings.TrimPrefix(u[0].String(), "check."))
	}
	if doc.Check == nil {
		return nil, errors.New("not a TOML inline table of check keys")
	}
	v := &validator{file: "annotation", src: data}
	spec, ok := v.check("check", "annotation", doc.Check)
	if !ok || len(v.errs) > 0 {
		msgs := make([]string, len(v.errs))
		for i, e := range v.errs {
			msgs[i] = e.Msg
		}
		return nil, errors.New(strings.Join(msgs, "; "))
	}
	if spec != nil && spec.Kind == health.KindExec {
		return nil, errors.New("exec checks are not allowed from an annotation: they would run commands on the load balancer")
	}
	return spec, nil
}

// ParseForward parses a forwarding method as the forward key takes it
// (masq or nat, droute or dr, tunnel or tun), with the file's message, as
// the Kubernetes source's vipd.io/forwarding annotation holds it.
func ParseForward(text string) (lb.Forward, error) {
	f, ok := parseForward(text)
	if !ok {
		return 0, fmt.Errorf("forward %q must be masq, droute or tunnel", text)
	}
	return f, nil
}
