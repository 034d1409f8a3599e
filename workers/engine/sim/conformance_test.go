package sim_test

import (
	"testing"

	"github.com/tokenbus/tokenbus/workers/engine"
	"github.com/tokenbus/tokenbus/workers/engine/enginetest"
	"github.com/tokenbus/tokenbus/workers/engine/sim"
)

func TestConformance(t *testing.T) {
	enginetest.Run(t, enginetest.Harness{
		Model: "sim",
		New: func(t *testing.T) engine.Engine {
			e, err := sim.New(enginetest.SimConfig("sim"))
			if err != nil {
				t.Fatal(err)
			}
			return e
		},
		Lacks: map[enginetest.Feature]string{
			enginetest.Faults: "the sim runs in-process: there is no server to fail",
		},
	})
}
