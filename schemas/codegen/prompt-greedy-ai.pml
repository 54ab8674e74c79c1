<!-- Imports the files the task touches, in schema order; database.py is left out. -->
<prompt schema="codegen">
  <utils.py/>
  <unit.py/>
  <board.py/>
  <player.py/>
  <game.py/>
  <user>
    Write a new file ai.py with a class GreedyAI whose method play_turn(game: Game) plays one full turn
    for game.current_player: every living unit first attacks the weakest enemy unit it can reach with
    an attack, otherwise moves one step closer to the nearest strategic point not yet captured by its
    owner. Use Board.reachable and Game.unit_at; do not change the existing files.
  </user>
</prompt>
