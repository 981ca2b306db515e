package main

import (
	"strings"
	"testing"
)

// TestParseTraceLine: trace_pipe's lines for the kretprobe and for
// markers, with and without the TGID column, and what is not a line.
func TestParseTraceLine(t *testing.T) {
	for _, c := range []struct {
		line string
		want traceEvent
	}{
		{"            vipd-412     [001] d..1.   123.456789: ipvs_set: (genl_family_rcv_msg_doit+0xe7/0x150 <- ip_vs_genl_set_cmd) ret=0",
			traceEvent{Mono: 123456789000, Comm: "vipd", PID: 412, Name: "ipvs_set", Text: "(genl_family_rcv_msg_doit+0xe7/0x150 <- ip_vs_genl_set_cmd) ret=0"}},
		{"           <...>-9     (    9) [000] .....     7.000001: ipvs_set: (genl_family_rcv_msg_doit+0xe7/0x150 <- ip_vs_genl_set_cmd) ret=-22",
			traceEvent{Mono: 7000001000, Comm: "<...>", PID: 9, Name: "ipvs_set", Ret: -22, Text: "(genl_family_rcv_msg_doit+0xe7/0x150 <- ip_vs_genl_set_cmd) ret=-22"}},
		{"     kworker/0:1-1234    [000] ..... 98765.000100: tracing_mark_write: vipd-bench: clock check",
			traceEvent{Mono: 98765000100000, Comm: "kworker/0:1", PID: 1234, Name: "tracing_mark_write", Text: "vipd-bench: clock check"}},
	} {
		got, err := parseTraceLine(c.line)
		if err != nil || got != c.want {
			t.Errorf("%q:\n got %+v, %v\nwant %+v", c.line, got, err, c.want)
		}
	}
	for _, bad := range []string{
		"",
		"CPU:1 [LOST 3 EVENTS]",
		"            vipd-412     [001] d..1.   123.456789: ipvs_set: (genl_family_rcv_msg_doit+0xe7/0x150 <- ip_vs_genl_set_cmd)",
	} {
		if ev, err := parseTraceLine(bad); err == nil {
			t.Errorf("%q: parsed as %+v", bad, ev)
		}
	}
}

// TestParseLayouts: -layouts takes single and split, once each, in the
// order given.
func TestParseLayouts(t *testing.T) {
	for in, want := range map[string]string{"single,split": "single,split", "split": "split", "split,single": "split,single"} {
		got, err := parseLayouts(in)
		if err != nil || strings.Join(got, ",") != want {
			t.Errorf("%q: %v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "single,single", "one", "single,"} {
		if got, err := parseLayouts(bad); err == nil {
			t.Errorf("%q: %v, no error", bad, got)
		}
	}
}

// TestCommOf: the kernel cuts a command's name to 15 bytes.
func TestCommOf(t *testing.T) {
	if got := commOf("/payload/vipd"); got != "vipd" {
		t.Errorf("got %q", got)
	}
	if got := commOf("/x/a-very-long-binary-name"); got != "a-very-long-bin" {
		t.Errorf("got %q", got)
	}
}
