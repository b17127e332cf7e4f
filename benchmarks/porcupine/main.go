// The queue model of harel-ref's SPEC.md for one group, with fairness unspecified, checked by
// Porcupine: the peer that benchmarks/linearizability.py times against the Python checker on
// the same partitions.  It reads a JSON file (a list of partitions, each a list of calls as
// benchmarks/linearizability.py writes them) and prints the seconds the check took and its
// verdict.  Times are the Python checker's: invoke and complete in seconds, and the window
// [at_lo, at_hi] of the transport's clock in which the call happened (SPEC.md R18).
package main

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"time"

	"github.com/anishathalye/porcupine"
)

type call struct {
	Op         string   `json:"op"`
	Invoke     float64  `json:"invoke"`
	Complete   float64  `json:"complete"`
	AtLo       float64  `json:"at_lo"`
	AtHi       float64  `json:"at_hi"`
	Event      string   `json:"event"`
	Token      string   `json:"token"`
	None       bool     `json:"none"`
	Visibility float64  `json:"visibility"`
	Delay      float64  `json:"delay"`
	Answer     *bool    `json:"answer"`
	Partition  int      `json:"-"`
}

// hold: none (0), a lease under token (1) or a park (2), until [untilLo, untilHi].
type group struct {
	messages         []string
	hold             int
	token            string
	untilLo, untilHi float64
}

func step(s interface{}, in interface{}, _ interface{}) (bool, interface{}) {
	g := s.(group)
	c := in.(call)
	switch c.Op {
	case "publish":
		next := g
		next.messages = append(append([]string(nil), g.messages...), c.Event)
		return true, next
	case "claim":
		if c.None { // R2: allowed if the group may be in flight throughout some moment, or is gone
			return len(g.messages) == 0 || (g.hold != 0 && g.untilHi >= c.AtLo), g
		}
		if len(g.messages) == 0 || g.messages[0] != c.Event {
			return false, g
		}
		earliest := math.Inf(-1) // R3: free strictly after the hold's earliest end
		if g.hold != 0 {
			earliest = g.untilLo
		}
		if earliest >= c.AtLo && !(earliest < c.AtHi) {
			return false, g
		}
		next := g
		next.hold, next.token = 1, c.Token
		next.untilLo, next.untilHi = c.AtLo+c.Visibility, c.AtHi+c.Visibility
		return true, next
	default: // ack, nack: act only under the current token (R10)
		acted := g.hold == 1 && g.token == c.Token
		if acted != *c.Answer {
			return false, g
		}
		if !acted {
			return true, g
		}
		next := g
		next.hold, next.token = 0, ""
		if c.Op == "ack" {
			next.messages = append([]string(nil), g.messages[1:]...)
		} else if c.Delay > 0 {
			next.hold, next.untilLo, next.untilHi = 2, c.AtLo+c.Delay, c.AtHi+c.Delay
		}
		return true, next
	}
}

func equal(a, b interface{}) bool {
	x, y := a.(group), b.(group)
	if x.hold != y.hold || x.token != y.token || x.untilLo != y.untilLo || x.untilHi != y.untilHi || len(x.messages) != len(y.messages) {
		return false
	}
	for i := range x.messages {
		if x.messages[i] != y.messages[i] {
			return false
		}
	}
	return true
}

func hash(s interface{}) uint64 {
	g := s.(group)
	h := fnv.New64a()
	fmt.Fprintf(h, "%d|%s|%v|%v|%d", g.hold, g.token, g.untilLo, g.untilHi, len(g.messages))
	for _, m := range g.messages {
		h.Write([]byte(m))
		h.Write([]byte{0})
	}
	return h.Sum64()
}

func main() {
	data, err := os.ReadFile(os.Args[1])
	if err != nil {
		panic(err)
	}
	var partitions [][]call
	if err := json.Unmarshal(data, &partitions); err != nil {
		panic(err)
	}
	var history []porcupine.Operation
	for p, part := range partitions {
		for _, c := range part {
			c.Partition = p
			history = append(history, porcupine.Operation{
				Input: c, Call: int64(c.Invoke * 1e9), Return: int64(c.Complete * 1e9),
			})
		}
	}
	model := porcupine.Model{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			parts := make([][]porcupine.Operation, len(partitions))
			for _, op := range h {
				p := op.Input.(call).Partition
				parts[p] = append(parts[p], op)
			}
			return parts
		},
		Init:  func() interface{} { return group{} },
		Step:  step,
		Equal: equal,
		Hash:  hash,
	}
	started := time.Now()
	ok := porcupine.CheckOperations(model, history)
	verdict := "not-linearizable"
	if ok {
		verdict = "linearizable"
	}
	fmt.Printf("%.6f %s\n", time.Since(started).Seconds(), verdict)
}
