package config

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/check"
)

// MaxCheckText bounds the text ParseCheck takes.
const MaxCheckText = 4096

// MinAnnotationInterval is the shortest interval an annotation's check
// may ask for (a file's may go down to check.MinInterval): whoever may
// annotate a Service must not make the load balancer probe each of its
// backends a hundred times a second.
const MinAnnotationInterval = time.Second

// annotationCheckKeys are the keys of [service.check] that an
// annotation may set: they shape the probe sent to the backend's own
// address, and reach nothing else. It is an allow-list: a key added to
// the file's checks is refused in annotations until it is added here.
// Refused are the keys that aim the probe elsewhere (address), give it
// the load balancer's own identity on the network (mark, device,
// source), read the load balancer's files (ca_file) or run commands
// (command, args, env).
var annotationCheckKeys = map[string]bool{
	"type": true, "port": true, "half_open": true,
	"interval": true, "timeout": true, "rise": true, "fall": true, "initial": true, "jitter": true,
	"method": true, "path": true, "host": true, "headers": true, "sni": true, "insecure": true,
	"status": true, "body": true, "body_regexp": true, "keep_alive": true,
	"payload": true, "expect": true,
	"name": true, "record": true, "tcp": true, "expect_answer": true, "no_recursion": true,
}

// ParseCheck parses a health check written as a TOML inline table with
// the keys of [service.check], as the Kubernetes source's vipd.io/check
// annotation holds it ({ type = "http", path = "/healthz" }), with the
// file's messages. It returns nil for type = "none".
//
// The check is confined to the backend, for whoever may annotate a
// Service must not aim the load balancer anywhere else: only the keys of
// annotationCheckKeys are taken, and exec checks are refused (they would
// run commands on the load balancer). A port other than the backend's
// is taken (a health port on the backend's address); the caller decides
// whether the backends allow it.
func ParseCheck(text string) (*check.Spec, error) {
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
	if doc.Check.Type == "exec" {
		return nil, errExecAnnotation
	}
	for _, k := range md.Keys() {
		if len(k) == 2 && k[0] == "check" && !annotationCheckKeys[k[1]] {
			return nil, fmt.Errorf("key %q is not allowed in an annotation: an annotation's check probes the backend's address and sets nothing of the load balancer's own", k[1])
		}
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
	if spec != nil && spec.Interval != 0 && spec.Interval < MinAnnotationInterval {
		return nil, fmt.Errorf("interval %s is shorter than %s, the least an annotation's check may ask for", spec.Interval, MinAnnotationInterval)
	}
	if spec != nil && (spec.Kind == check.KindExec || spec.Addr.IsValid() || spec.Dial != (check.DialOptions{}) || spec.HTTP.CAFile != "") {
		// The keys were refused above; this guards the spec itself.
		return nil, errors.New("an annotation's check probes the backend's address and sets nothing of the load balancer's own")
	}
	return spec, nil
}

var errExecAnnotation = errors.New("exec checks are not allowed from an annotation: they would run commands on the load balancer")

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
