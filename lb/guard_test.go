package lb_test

import (
	"testing"

	"github.com/vipd/vipd/lb"
)

func TestRemoved(t *testing.T) {
	old := benchSpec(10, 4)
	for _, tt := range []struct {
		name   string
		cur    *lb.Spec
		want   lb.Removal
		exceed bool
	}{
		{"same", benchSpec(10, 4), lb.Removal{0, 10, 0, 40}, false},
		{"truncated file", &lb.Spec{}, lb.Removal{10, 10, 40, 40}, true},
		{"half the services", benchSpec(5, 4), lb.Removal{5, 10, 20, 40}, false},
		{"most backends", benchSpec(10, 1), lb.Removal{0, 10, 30, 40}, true},
		{"growth", benchSpec(20, 8), lb.Removal{0, 10, 0, 40}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := lb.Removed(old, tt.cur)
			if got != tt.want {
				t.Fatalf("Removed = %+v, want %+v", got, tt.want)
			}
			if ex, desc := got.Exceeds(0.5); ex != tt.exceed {
				t.Errorf("Exceeds(0.5) = %v (%s), want %v", ex, desc, tt.exceed)
			}
		})
	}
	// A renamed service keeps its address: nothing is removed.
	renamed := benchSpec(10, 4)
	for i := range renamed.Services {
		renamed.Services[i].Name += "-renamed"
	}
	if got := lb.Removed(old, renamed); got != (lb.Removal{0, 10, 0, 40}) {
		t.Errorf("Removed(renamed) = %+v, want nothing removed", got)
	}
	if ex, _ := lb.Removed(old, &lb.Spec{}).Exceeds(1); ex {
		t.Error("a guard of 1 refused a removal")
	}
	if ex, _ := lb.Removed(&lb.Spec{}, old).Exceeds(0.1); ex {
		t.Error("a first configuration was refused")
	}
}
