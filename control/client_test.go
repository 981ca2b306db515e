package control

import (
	"strings"
	"testing"
)

// TestAnswerPieces checks the status answer's head and tail, and the copy
// of what lies between, wherever the pieces it was read in are cut.
func TestAnswerPieces(t *testing.T) {
	const snap = `{"a":[1,{}],"b":"}\n"}`
	body := []byte(`{"status":` + snap + "}\n")
	for i := 1; i < len(body); i++ {
		for j := i; j < len(body); j++ {
			a := Answer{OK: true, pieces: [][]byte{body[:i], body[i:j], body[j:]}}
			head, tail, ok := a.StatusJSON()
			if !ok {
				t.Fatalf("cut at %d and %d: not a status answer", i, j)
			}
			var b strings.Builder
			if err := a.Copy(&b, head, tail); err != nil {
				t.Fatal(err)
			}
			if b.String() != snap {
				t.Fatalf("cut at %d and %d: %q, want %q", i, j, b.String(), snap)
			}
		}
	}
	for _, body := range []string{`{"error":"no"}` + "\n", `{"status":{}}`, `{"status":`, ""} {
		if _, _, ok := (Answer{OK: true, pieces: [][]byte{[]byte(body)}}).StatusJSON(); ok {
			t.Errorf("%q taken for a status answer", body)
		}
	}
	if _, _, ok := (Answer{OK: false, pieces: [][]byte{body}}).StatusJSON(); ok {
		t.Error("an answer that is not 200 OK taken for a status answer")
	}
}
