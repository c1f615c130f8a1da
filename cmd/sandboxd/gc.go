package main

import (
	"errors"

	"github.com/spf13/cobra"
)

func (c *cli) gcCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "gc",
		Short: "Remove this installation's leftovers no session claims",
		Args:  exactArgs(),
		RunE:  func(cmd *cobra.Command, _ []string) error { return errors.New("not yet") },
	}
}
