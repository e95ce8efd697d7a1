"""Layer 1 (top): the ``skewer`` command, one module per subcommand.

:mod:`pipeline.cli.app` builds the parser and maps errors to exit codes;
:mod:`pipeline.cli.arguments` holds the options every subcommand repeats. A subcommand parses
and validates its flags, then hands over to the layer below (:mod:`pipeline.runs`,
:mod:`pipeline.stages`, :mod:`pipeline.services`, :mod:`operators`). Nothing imports this
package but the ``skewer`` entry point; ``bench`` adds its subcommand through the
``skewer.commands`` entry-point group, so ``pipeline`` never imports ``bench``.
"""
