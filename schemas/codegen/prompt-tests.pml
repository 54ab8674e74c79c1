<!-- Every file of the schema: the cached states of all six modules are reused. -->
<prompt schema="codegen">
  <utils.py/>
  <unit.py/>
  <board.py/>
  <player.py/>
  <game.py/>
  <database.py/>
  <user>
    Write pytest tests for the movement rules: forest costs two movement points, water blocks
    everything except flying units, a unit cannot move onto an occupied cell, and moving onto a
    strategic point transfers it from the opponent. Build boards with Board.from_text.
  </user>
</prompt>
