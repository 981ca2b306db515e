package agent

import (
	"context"
	"slices"
	"testing"
)

// TestStatusPageFacts checks what the agent adds to a snapshot for the
// status page: each service's source, and the last reload.
func TestStatusPageFacts(t *testing.T) {
	src := newFakeSource("kubernetes")
	r := newRig(t, services(1, 1), src)
	publish(t, src.sink(t), vs("k8s/a", "192.0.2.50", "10.1.0.1"))
	r.has(t, "192.0.2.50:80")
	st, err := r.a.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	sources := map[string]string{}
	for _, s := range st.Services {
		sources[s.Name] = s.Source
	}
	if sources["k8s/a"] != "kubernetes" || sources["tcp-192.0.2.10-80"] != "" || len(sources) != 2 {
		t.Errorf("sources %v", sources)
	}
	if st.Reload != nil {
		t.Errorf("a reload before any: %+v", st.Reload)
	}
	r.write(services(2, 1))
	if _, err := r.a.Reload(context.Background(), ReloadOptions{Why: "test"}); err != nil {
		t.Fatal(err)
	}
	st, err = r.a.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if rl := st.Reload; rl == nil || rl.Why != "test" || rl.Result != "applied" || rl.Applied == 0 || !slices.Contains(rl.Changes, "add-service 1") {
		t.Errorf("reload %+v", rl)
	}
	r.write("[[service]]\nname = \"broken\"\n")
	if _, err := r.a.Reload(context.Background(), ReloadOptions{Why: "test"}); err == nil {
		t.Fatal("a broken file was accepted")
	}
	st, _ = r.a.Status(context.Background())
	if rl := st.Reload; rl == nil || rl.Result != "failed" || rl.Error == "" || rl.Applied != 0 {
		t.Errorf("failed reload %+v", rl)
	}
}
